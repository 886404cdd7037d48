"""PostgreSQL going down or coming up is a 503 with Retry-After, not a 500, and an outage is a
line per cause in the server's log, not a traceback per request (issue 33, item 8).

During a smart shutdown PostgreSQL refuses new sessions with "the database system is shutting
down" (and one starting up with "is starting up", one recovering after a crash with "is in
recovery mode"): 16 of 30 reads and 7 of 30 writes were answered 500 ``internal``, and a 10 s
outage logged 131 full tracebacks. Here a real PostgreSQL of the test's own is shut down
(smart: the server's pooled sessions go on, new ones are refused) while 30 reads and 30 writes
arrive at once, then stopped and started again: every answer is a success or a 503 naming
the cause with Retry-After, the server answers normally once the database is back, and its
log has no traceback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import pgkit
import strictkit
from batchyard.server.storage_trouble import cause_of
from yardkit import Yard, wait_until

pytestmark = [pytest.mark.timeout(240),
              strictkit.requires(pgkit.pg_bin() is None, "PostgreSQL is not installed")]


@pytest.fixture(scope="module")
def pg() -> Iterator[pgkit.Postgres]:
    server = pgkit.Postgres()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory, pg: pgkit.Postgres) -> Iterator[Yard]:
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env["BATCHYARD_DB_URL"] = pg.create_database()
    try:
        y.start_server()
        yield y
    finally:
        y.stop()


def _burst(yard: Yard, label: str) -> list[httpx.Response]:
    """30 reads and 30 writes at once, each on a connection of its own."""
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        with httpx.Client(base_url=yard.url + "/api/v1", timeout=60,
                          headers={"Authorization": f"Bearer {yard.token}"}) as http:
            if i % 2:
                resp = http.get("/workspaces/default/jobs", params={"limit": 5})
            else:
                resp = http.post("/workspaces/default/experiments",
                                 json={"name": f"{label}-{i}"})
        with lock:
            answers.append(resp)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return answers


def test_the_database_going_down_and_up_is_a_503_and_a_line_per_cause(
        team: Yard, pg: pgkit.Postgres) -> None:
    # a few requests, one at a time: the server's pool keeps a session or two, so most of
    # the burst below needs new sessions
    team.ok("experiment", "create", "-n", "warm")
    pg.shutdown("smart")  # the pool's sessions stay; new ones are refused while it waits
    try:
        answers = _burst(team, "smart")
    finally:
        pg.shutdown("fast")
        pg.wait_stopped()
    codes = sorted(r.status_code for r in answers)
    assert set(codes) <= {200, 201, 503}, [(r.status_code, r.text) for r in answers
                                           if r.status_code not in (200, 201, 503)]
    refused = [r for r in answers if r.status_code == 503]
    assert refused, codes  # (more requests at once than the pool had sessions)
    for r in refused:
        assert r.headers.get("Retry-After"), r.headers
        error = r.json()["error"]
        assert error["code"] == "storage_unavailable", error
        assert "database server" in error["message"], error
    down = _burst(team, "down")  # no database at all: a 503 too
    assert {r.status_code for r in down} == {503}, [(r.status_code, r.text) for r in down]

    pg.launch()
    wait_until(lambda: all(r.status_code in (200, 201) for r in _burst(team, "back")), 60,
               interval=1, what="the server to answer normally with its database back")
    log = (team.home / "server.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
    lines = [line for line in log.splitlines() if "storage trouble" in line]
    assert 1 <= len(lines) <= 6, lines  # one per cause, not one per request


@pytest.mark.parametrize("text", [
    "connection failed: FATAL:  the database system is shutting down",
    'connection to server at "127.0.0.1", port 5432 failed: FATAL:  the database system is '
    "starting up",
    "FATAL:  the database system is in recovery mode",
])
def test_postgres_going_down_or_up_is_storage_trouble(text: str, tmp_path: Path) -> None:
    import psycopg
    from sqlalchemy.exc import OperationalError

    exc = OperationalError("SELECT 1", {}, psycopg.OperationalError(text))
    assert cause_of(exc) is not None, text
