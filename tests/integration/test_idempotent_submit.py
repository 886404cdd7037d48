"""Idempotent submit (issue 16, item 4): a retried submit never makes a second job — with the
same Idempotency-Key sent twice, by 20 clients at once, and through a connection that loses
the server's first answer (the client's own retry, over a real proxy)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from batchyard.client.http import Client
from batchyard.store.db import normal_url
from yardkit import Yard

JOBS = "/workspaces/default/jobs"


def _body(name: str, command: str = "true") -> dict[str, Any]:
    return {"spec": {"command": command, "distribution": {"type": "custom"}}, "name": name,
            "cluster": "idem"}


@pytest.fixture(scope="module")
def idem(yard: Yard) -> str:
    yard.ok("cluster", "create", "-n", "idem", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("idem", 1)
    return "idem"


def _jobs_named(yard: Yard, prefix: str) -> list[dict[str, Any]]:
    return [j for j in yard.http.get(JOBS).json() if j["name"].startswith(prefix)]


def test_the_same_key_twice_makes_one_job(yard: Yard, idem: str) -> None:
    first = yard.http.post(JOBS, json=_body("twice"), headers={"Idempotency-Key": "k-twice"})
    again = yard.http.post(JOBS, json=_body("twice"), headers={"Idempotency-Key": "k-twice"})
    assert first.status_code == 201, first.text
    assert again.status_code == 201, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert len(_jobs_named(yard, "twice")) == 1


def test_twenty_clients_with_one_key_make_one_job(yard: Yard, idem: str) -> None:
    def send(_: int) -> httpx.Response:
        with httpx.Client(base_url=yard.url + "/api/v1", timeout=60,
                          headers={"Authorization": f"Bearer {yard.token}"}) as c:
            return c.post(JOBS, json=_body("crowd"), headers={"Idempotency-Key": "k-crowd"})

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(send, range(20)))
    assert {a.status_code for a in answers} == {201}, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert sum(a.headers.get("Idempotent-Replayed") == "true" for a in answers) == 19
    assert len(_jobs_named(yard, "crowd")) == 1


def test_a_key_reused_for_another_request_is_a_409(yard: Yard, idem: str) -> None:
    assert yard.http.post(JOBS, json=_body("reuse-a"),
                          headers={"Idempotency-Key": "k-reuse"}).status_code == 201
    other = yard.http.post(JOBS, json=_body("reuse-b"), headers={"Idempotency-Key": "k-reuse"})
    assert other.status_code == 409, other.text
    assert "k-reuse" in other.json()["error"]["message"]
    assert not _jobs_named(yard, "reuse-b")


@pytest.mark.parametrize("key", ["has space", "x" * 201, "tab\there"])
def test_a_bad_key_is_a_4xx_naming_the_header(yard: Yard, idem: str, key: str) -> None:
    resp = yard.http.post(JOBS, json=_body("badkey"),
                          headers={"Idempotency-Key": key})
    assert resp.status_code == 422, resp.text
    assert "idempotency" in resp.text.lower()
    assert not _jobs_named(yard, "badkey")


class _LosingProxy:
    """A TCP proxy whose first connection forwards the request and then drops the server's
    answer: the submit happened, and the client cannot know."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            lose = self.connections == 1
            threading.Thread(target=self._relay, args=(conn, lose), daemon=True).start()

    def _relay(self, conn: socket.socket, lose: bool) -> None:
        up = socket.create_connection(self.upstream)

        def pump(src: socket.socket, dst: socket.socket | None) -> None:
            try:
                while data := src.recv(65536):
                    if dst is None:  # the answer arrived: lose it
                        with contextlib.suppress(OSError):
                            conn.shutdown(socket.SHUT_RDWR)
                        conn.close()
                        return
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    if s is not None:
                        with contextlib.suppress(OSError):
                            s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(conn, up), daemon=True).start()
        pump(up, None if lose else conn)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def losing_proxy(yard: Yard) -> Iterator[_LosingProxy]:
    url = httpx.URL(yard.url)
    proxy = _LosingProxy((url.host, url.port or 80))
    yield proxy
    proxy.close()


def test_the_client_retries_a_lost_answer_without_a_second_job(
        yard: Yard, idem: str, losing_proxy: _LosingProxy) -> None:
    client = Client(f"http://127.0.0.1:{losing_proxy.port}", yard.token)
    try:
        result = client.submit(JOBS, _body("lost"))
    finally:
        client.close()
    assert losing_proxy.connections >= 2  # the first answer was lost, and it tried again
    assert result["name"] == "lost"
    assert len(_jobs_named(yard, "lost")) == 1


def test_the_cli_sends_a_key_with_each_submit(yard: Yard, idem: str) -> None:
    job = yard.write_job("clikey", {"name": "clikey", "cluster": idem, "command": "true",
                                    "distribution": {"type": "custom"}})
    yard.ok("job", "create", "-f", str(job))
    engine = create_engine(normal_url(yard.env.get("BATCHYARD_DB_URL")
                                      or f"sqlite:///{yard.home / 'batchyard.db'}"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT k.key FROM idempotency_keys k JOIN jobs j "
                                     "ON j.id = k.job_id WHERE j.name = 'clikey'")).all()
    finally:
        engine.dispose()
    assert len(rows) == 1 and len(rows[0][0]) == 32
