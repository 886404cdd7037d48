"""A team server on a real PostgreSQL (issue 16, item 5): two server processes on one
database never run a job twice. One holds the reconciler's lease and runs every job; the
other answers the API (submits through it run too) and stands by; when the leader is
killed -9 the standby takes the lease over and runs what comes next, and no job ran twice.

Runs against the session's PostgreSQL when the suite runs on one (BATCHYARD_TEST_DB), else
against one of its own."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import pgkit
from yardkit import Yard, pid_alive, wait_until

pytestmark = pytest.mark.skipif(pgkit.pg_bin() is None, reason="PostgreSQL is not installed")


@pytest.fixture(scope="module")
def database(postgres_database: Callable[[], str]) -> str:
    return postgres_database()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, database: str) -> Iterator[list[Yard]]:
    yards = []
    for label in ("a", "b"):
        y = Yard(tmp_path_factory.mktemp(f"home-{label}"), tmp_path_factory.mktemp("work"))
        y.env["BATCHYARD_DB_URL"] = database  # the same database for both
        yards.append(y)
    try:
        for y in yards:
            y.start_server()
        yield yards
    finally:
        for y in yards:
            y.stop()


def _leader(yards: list[Yard]) -> tuple[Yard, Yard]:
    def leads(y: Yard) -> bool:
        log = (y.home / "server.log").read_text(errors="replace")
        return "this server runs the reconciler" in log

    found = wait_until(lambda: [y for y in yards if leads(y)] or None, 60,
                       what="a server to take the reconciler lease")
    assert len(found) == 1, "both servers claim the lease"
    return found[0], next(y for y in yards if y is not found[0])


def _submit(y: Yard, name: str, marks: Path) -> None:
    job = y.write_job(name, {  # (the folder of marks: the job's mount, open to its uid)
        "name": name, "cluster": "pg2", "distribution": {"type": "custom"},
        "mounts": [{"kind": "local", "relative_path": "marks", "source": str(marks.parent)}],
        "command": f'echo "$BATCHYARD_JOB_NAME" >> {marks}'})
    y.ok("job", "create", "-f", str(job))


def test_two_servers_on_one_database_run_each_job_once(pair: list[Yard],
                                                       tmp_path: Path) -> None:
    leader, standby = _leader(pair)
    leader.ok("cluster", "create", "-n", "pg2", "-s", "Standard_D2_v2", "-t", "2")
    leader.wait_cluster("pg2", 2)
    standby.wait_cluster("pg2", 2)  # the standby reads the same state
    marks = leader.exchange("once")[0] / "marks"
    names = [f"once-{i}" for i in range(12)]
    for i, name in enumerate(names):
        _submit(pair[i % 2], name, marks)  # through both servers
    for name in names:
        assert leader.wait_job(name, timeout=180)["state"] == "succeeded", name
    ran = Counter(marks.read_text().split())
    assert ran == Counter(names), ran  # each exactly once
    for name in names:
        assert len(standby.job(name)["attempts"]) == 1
    standby_log = (standby.home / "server.log").read_text(errors="replace")
    assert "stands by" in standby_log

    os.kill(leader.server_pid, signal.SIGKILL)  # the standby takes over
    wait_until(lambda: not pid_alive(leader.server_pid), 20)
    wait_until(lambda: "this server runs the reconciler"
               in (standby.home / "server.log").read_text(errors="replace"), 60,
               what="the standby to take the lease")
    later = [f"later-{i}" for i in range(4)]
    for name in later:
        _submit(standby, name, marks)
    for name in later:
        assert standby.wait_job(name, timeout=180)["state"] == "succeeded", name
    ran = Counter(marks.read_text().split())
    assert ran == Counter(names + later), ran
