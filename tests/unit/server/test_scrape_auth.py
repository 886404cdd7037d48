"""Who may read GET /metrics (server/scrape_auth.py), through the real app in-process on a
real SQLite store: with no token only a loopback client of a server that listens on
loopback; the scrape token (made by `server token --scrape` at any time) or the admin token
from anywhere; a wrong token, a job token or another scheme is a 401 everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from batchyard import scrape_token
from batchyard.server.app import create_app
from batchyard.server.context import ServerContext
from batchyard.store.db import Database

ADMIN = "admin-secret"


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.setenv("BATCHYARD_HOME", str(tmp_path))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.migrate()
    clients: list[TestClient] = []

    def client(bind: str, peer: str) -> TestClient:
        ctx = ServerContext(db=db, admin_token=ADMIN, api_url="http://127.0.0.1:1",
                            bind_host=bind)
        made = TestClient(create_app(ctx), client=(peer, 40000))
        clients.append(made)
        return made

    yield client
    for made in clients:
        made.close()


def get(client: TestClient, token: str | None = None, scheme: str = "Bearer") -> int:
    headers = {"Authorization": f"{scheme} {token}"} if token is not None else {}
    return client.get("/metrics", headers=headers).status_code


def test_loopback_server_is_open_to_loopback_only(make: object) -> None:
    local = make("127.0.0.1", "127.0.0.1")  # type: ignore[operator]
    answer = local.get("/metrics")
    assert answer.status_code == 200 and "batchyard_jobs" in answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    assert get(make("127.0.0.1", "10.0.0.7")) == 401  # type: ignore[operator]


def test_wrong_tokens_are_refused_even_on_loopback(make: object) -> None:
    local = make("127.0.0.1", "127.0.0.1")  # type: ignore[operator]
    assert get(local, "wrong") == 401
    assert get(local, "job.0123456789abcdef") == 401
    assert get(local, ADMIN, scheme="Basic") == 401
    answer = local.get("/metrics", headers={"Authorization": "Bearer wrong"})
    assert answer.json()["error"]["code"] == "unauthorized"  # JSON, not the portal's page


def test_beyond_loopback_the_scrape_token_is_needed(make: object) -> None:
    public = make("0.0.0.0", "127.0.0.1")  # type: ignore[operator]
    assert get(public) == 401
    token = scrape_token.ensure()  # made after the server started: taken at once
    assert token.startswith("scrape.") and get(public, token) == 200
    assert get(public, ADMIN) == 200
    assert get(make("0.0.0.0", "192.0.2.10"), token) == 200  # type: ignore[operator]
    assert scrape_token.ensure() == token  # made once
    assert oct(scrape_token.token_file().stat().st_mode & 0o777) == "0o600"


def test_the_scrape_token_reaches_nothing_else(make: object) -> None:
    public = make("0.0.0.0", "192.0.2.10")  # type: ignore[operator]
    token = scrape_token.ensure()
    answer = public.get("/api/v1/workspaces", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 401
