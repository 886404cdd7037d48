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
import strictkit
from yardkit import Yard, pid_alive, wait_until

pytestmark = strictkit.requires(pgkit.pg_bin() is None, "PostgreSQL is not installed")


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


def _running_ranks(y: Yard, name: str) -> bool:
    job = y.job(name)
    return job["state"] == "running" and any(
        r.get("ranks") for r in y.node_reports(job))


def test_a_leader_killed_during_a_run_hands_its_running_jobs_over(
        tmp_path_factory: pytest.TempPathFactory, postgres_database: Callable[[], str],
        tmp_path: Path) -> None:
    """Issue 33, item 6: kill -9 of the leader while jobs ran stranded them (their launchers
    reported only to its dead address: `running` for good, their nodes held, the queue
    behind them waiting, 3 of 80 lines shown). The launchers find the standby, which took the
    lease: every job ends in its true state with every log line, and none runs twice."""
    url = postgres_database()
    yards = []
    for label in ("x", "y"):
        y = Yard(tmp_path_factory.mktemp(f"home-{label}"), tmp_path_factory.mktemp("work"))
        y.env["BATCHYARD_DB_URL"] = url
        yards.append(y)
    try:
        yards[0].start_server()
        wait_until(lambda: "this server runs the reconciler" in
                   (yards[0].home / "server.log").read_text(errors="replace"), 60)
        yards[1].start_server()
        leader, standby = _leader(yards)
        assert leader is yards[0]
        standby.ok("cluster", "create", "-n", "fo2", "-s", "Standard_D2_v2", "-t", "2")
        standby.wait_cluster("fo2", 2)
        # a job writes nowhere but its folders and mounts, and reads as an unprivileged uid
        folder, mount = standby.exchange("marks")
        marks = folder / "marks"
        go = folder / "go"
        names = [f"fo-{i}" for i in range(8)]
        for name in names:  # through the standby; 2 run at a time, the rest queue
            job = standby.write_job(name, {
                "name": name, "cluster": "fo2", "distribution": {"type": "custom"},
                "mounts": [mount],
                "command": (f'echo "$BATCHYARD_JOB_NAME" >> {marks}.start; '
                            f'for i in $(seq 1 20); do echo "$BATCHYARD_JOB_NAME line $i"; '
                            f'sleep 0.02; done; until [ -e {go} ]; do sleep 0.1; done; '
                            f'for i in $(seq 21 40); do echo "$BATCHYARD_JOB_NAME line $i"; '
                            f'done; echo "$BATCHYARD_JOB_NAME" >> {marks}')})
            standby.ok("job", "create", "-f", str(job))
        running = wait_until(lambda: [n for n in names if _running_ranks(standby, n)]
                             if len([n for n in names if _running_ranks(standby, n)]) == 2
                             else None, 120, what="2 jobs to run under the leader")
        wait_until(lambda: all(standby.ok("job", "logs", "-n", n).stdout.count(" line ") >= 20
                               for n in running), 60, what="the first lines to arrive")

        os.kill(leader.server_pid, signal.SIGKILL)  # during the run
        wait_until(lambda: not pid_alive(leader.server_pid), 20)
        go.touch()
        for name in names:
            done = standby.wait_job(name, timeout=240)
            assert done["state"] == "succeeded", done
            assert len(done["attempts"]) == 1, done  # nothing ran twice
        assert Counter(marks.read_text().split()) == Counter(names)
        assert Counter((folder / "marks.start").read_text().split()) == Counter(names)
        for name in names:
            out = standby.ok("job", "logs", "-n", name).stdout
            got = [line.rsplit(" ", 1)[-1] for line in out.splitlines() if " line " in line]
            assert got == [str(i) for i in range(1, 41)], (name, out)  # each line once
        nodes = standby.cluster("fo2")
        assert nodes["node_counts"]["idle"] == 2, nodes  # nothing held
    finally:
        for y in yards:
            y.stop()

