"""One server as several processes behind one port (``server start --workers N``, issue 18):
on a real PostgreSQL, with the real CLI and real launchers. Each job runs once whichever
process took its submit; a terminate written by one process reaches launchers polling
another; ``job exec`` finds its session whichever process the node's calls land on; a dead
worker is started again; a ``kill -9`` of the server leaves no worker behind. SQLite refuses
more than one process, naming the flag."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from sqlalchemy import select, text

from batchyard.server.services import channel
from batchyard.store.db import Database
from yardkit import CLUSTER, Yard, pid_alive, wait_until


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory,
         postgres_database: Callable[[], str]) -> Iterator[Yard]:
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env["BATCHYARD_DB_URL"] = postgres_database()
    y.env["BATCHYARD_WORKERS"] = "2"
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", CLUSTER, "-s", "Standard_D2_v2", "-t", "2")
        y.wait_cluster(CLUSTER, 2)
        yield y
    finally:
        y.stop()


def _workers(y: Yard) -> list[psutil.Process]:
    found = []
    for proc in psutil.Process(y.server_pid).children():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE \
                    and "batchyard.server" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue  # gone meanwhile
    return found


def _sleeper(y: Yard, name: str) -> None:
    job = y.write_job(name, {"name": name, "cluster": CLUSTER, "nodes": 2,
                             "command": "echo up; sleep 600"})
    y.ok("job", "create", "-f", str(job))
    wait_until(lambda: y.job(name)["state"] == "running", 120, what=f"{name} to run")


def test_the_server_is_two_processes_on_one_port(team: Yard) -> None:
    workers = _workers(team)
    assert len(workers) == 1
    port = int(team.url.rsplit(":", 1)[1])
    for proc in [psutil.Process(team.server_pid), *workers]:
        assert any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
                   for c in proc.net_connections("tcp")), proc


def test_each_job_runs_once_whichever_process_took_it(team: Yard, tmp_path: Path) -> None:
    folder, mount = team.exchange("once")  # the jobs write their marks there
    marks = folder / "marks"
    names = [f"once-{i}" for i in range(10)]
    for name in names:  # one CLI process each: a connection each, spread over both
        job = team.write_job(name, {"name": name, "cluster": CLUSTER,
                                    "distribution": {"type": "custom"}, "mounts": [mount],
                                    "command": f'echo "$BATCHYARD_JOB_NAME" >> {marks}'})
        team.ok("job", "create", "-f", str(job))
    for name in names:
        assert team.wait_job(name, timeout=180)["state"] == "succeeded", name
    assert Counter(marks.read_text().split()) == Counter(names)


def test_a_terminate_reaches_the_launchers_whatever_process_they_poll(team: Yard) -> None:
    _sleeper(team, "stop-me")
    team.ok("job", "terminate", "-n", "stop-me")
    assert team.wait_job("stop-me", timeout=60)["state"] == "canceled"


def test_log_followers_hear_lines_whatever_process_took_them(team: Yard) -> None:
    """Four followers (four connections, spread over both processes) of a job whose second
    line comes 5 s after its first: each hears of it from whichever process took the line,
    rather than at its own safety re-read (every 15-45 s)."""
    name = "follow-me"
    job = team.write_job(name, {"name": name, "cluster": CLUSTER,
                                "command": "echo first; sleep 5; echo second; sleep 600"})
    team.ok("job", "create", "-f", str(job))
    wait_until(lambda: team.job(name)["state"] == "running", 120, what=f"{name} to run")
    argv = [sys.executable, "-m", "batchyard.cli.main", "job", "logs", "-n", name, "-f"]
    followers = [subprocess.Popen(argv, env=team.env, stdout=subprocess.PIPE, text=True,
                                  stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for _ in range(4)]
    heard: dict[int, dict[str, float]] = {i: {} for i in range(len(followers))}

    def read(i: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # each hears "first" at once (written already)
            for word in ("first", "second"):
                if word in line:
                    heard[i].setdefault(word, time.monotonic())
            if "second" in heard[i]:
                return

    readers = [threading.Thread(target=read, args=(i, p), daemon=True)
               for i, p in enumerate(followers)]
    try:
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout=60)
        gaps = [h["second"] - h["first"] for h in heard.values() if "second" in h]
        assert len(gaps) == 4, heard
        assert max(gaps) < 12, f"the second line came {[round(g, 1) for g in gaps]}s later"
    finally:
        for proc in followers:
            proc.kill()
            proc.wait()
        team.ok("job", "terminate", "-n", name)


def _served_by(worker: psutil.Process, follower: subprocess.Popen[str]) -> bool:
    """Whether the follower's stream is a connection the worker holds."""
    try:
        mine = {c.laddr.port for c in psutil.Process(follower.pid).net_connections("tcp")
                if c.status == psutil.CONN_ESTABLISHED}
        return any(c.raddr and c.raddr.port in mine for c in worker.net_connections("tcp"))
    except psutil.Error:
        return False


def test_a_follower_whose_worker_is_killed_prints_every_line_once(team: Yard,
                                                                 tmp_path: Path) -> None:
    """Issue 33, item 8: a follower whose worker was killed (and started again by its
    supervisor) quit with "incomplete chunked read", and 35 of 80 lines were never shown to
    it. It reconnects, to whichever process answers, and goes on after its last line."""
    name = "follow-through"
    go = tmp_path / "go"
    job = team.write_job(name, {"name": name, "cluster": CLUSTER, "command": (
        'for i in $(seq 1 30); do echo "line $i"; done; '
        f'until [ -e {go} ]; do sleep 0.1; done; '
        'for i in $(seq 31 80); do echo "line $i"; sleep 0.02; done')})
    team.ok("job", "create", "-f", str(job))
    wait_until(lambda: team.job(name)["state"] == "running", 120, what=f"{name} to run")
    worker = _workers(team)[0]
    argv = [sys.executable, "-m", "batchyard.cli.main", "job", "logs", "-n", name, "-f"]
    followers: list[subprocess.Popen[str]] = []
    try:
        on_worker: list[subprocess.Popen[str]] = []
        while not on_worker and len(followers) < 16:  # the kernel spreads connections
            proc = subprocess.Popen(argv, env=team.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL)
            followers.append(proc)
            with contextlib.suppress(AssertionError):
                wait_until(lambda p=proc: _served_by(worker, p), 15, interval=0.2,
                           what="a follower's stream")
                on_worker.append(proc)
        assert on_worker, "no follower's stream landed on the worker"
        worker.kill()  # kill -9 of the process serving it; its supervisor starts another
        go.touch()
        said = {}
        for proc in followers:
            out, said[proc.pid] = proc.communicate(timeout=180)
            assert proc.returncode == 0, said[proc.pid]
            got = [line.rsplit(" ", 1)[-1] for line in out.splitlines() if "line " in line]
            assert got == [str(i) for i in range(1, 81)], (got, said[proc.pid])  # once each
        assert "reconnecting" in said[on_worker[0].pid], said[on_worker[0].pid]
        assert team.job(name)["state"] == "succeeded"
    finally:
        for proc in followers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_exec_finds_its_session_whatever_process_the_node_calls(team: Yard) -> None:
    _sleeper(team, "exec-me")
    try:
        for i in range(8):  # sessions made in both processes; the launchers poll one each
            r = team.cli("job", "exec", "exec-me", "--node", str(i % 2), "--",
                         "sh", "-c", "echo rank $BATCHYARD_NODE_RANK; exit 3", timeout=60)
            assert r.rc == 3, str(r)
            assert f"rank {i % 2}" in r.stdout, str(r)
    finally:
        team.ok("job", "terminate", "-n", "exec-me")


def test_a_portal_sign_in_holds_in_every_process(team: Yard) -> None:
    """A browser's requests land on both processes (a connection each here): its sign-in
    holds on all of them, and signing out ends it on all of them."""
    with httpx.Client(base_url=team.url, timeout=10) as browser:
        signed = browser.post("/login", data={"token": team.token, "next": "/clusters"},
                              headers={"Origin": team.url})
        assert signed.status_code == 303, signed.text
        cookie = browser.cookies.get("batchyard_session")
        assert cookie
    assert _fresh_gets(team, cookie, 12) == [200] * 12
    with httpx.Client(base_url=team.url, timeout=10,
                      cookies={"batchyard_session": cookie}) as browser:
        csrf = re.search(r'name="csrf" value="([^"]+)"', browser.get("/clusters").text)
        assert csrf, "no sign-out form on the page"
        out = browser.post("/logout", data={"csrf": csrf.group(1)},
                           headers={"Origin": team.url})
        assert out.status_code == 303
    assert _fresh_gets(team, cookie, 6) == [303] * 6


def _fresh_gets(team: Yard, cookie: str, count: int) -> list[int]:
    """The status of a portal page asked ``count`` times, a new connection each."""
    statuses = []
    for _ in range(count):
        with httpx.Client(base_url=team.url, timeout=10,
                          cookies={"batchyard_session": cookie}) as fresh:
            statuses.append(fresh.get("/clusters").status_code)
    return statuses


def test_keep_alive_connections_even_out_over_the_processes(team: Yard) -> None:
    """40 keep-alive clients, however the kernel hashed their connections: the busier
    process answers one request at a time with ``Connection: close`` (after running it),
    the client's next connection is hashed afresh, and the processes' connections end
    within one of an even split. No request fails meanwhile."""
    port = int(team.url.rsplit(":", 1)[1])
    procs = [psutil.Process(team.server_pid), *_workers(team)]
    clients = [httpx.Client(base_url=team.url + "/api/v1", timeout=30,
                            headers={"Authorization": f"Bearer {team.token}"},
                            limits=httpx.Limits(max_connections=1))
               for _ in range(40)]

    def held() -> list[int]:
        return [sum(1 for c in p.net_connections("tcp")
                    if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)
                for p in procs]

    try:
        first = [c.get("/health") for c in clients]
        assert {r.status_code for r in first} == {200}
        landed = Counter(r.json()["pid"] for r in first)
        closed = 0
        deadline = time.monotonic() + 60
        while True:
            answers = [c.get("/health") for c in clients]
            assert {r.status_code for r in answers} == {200}
            closed += sum(r.headers.get("connection") == "close" for r in answers)
            counts = held()
            if max(counts) - min(counts) <= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert max(counts) - min(counts) <= 1, (counts, landed)
        if max(landed.values()) - min(landed.get(p.pid, 0) for p in procs) >= 3:
            assert closed > 0, landed  # it did not even out by chance
    finally:
        for c in clients:
            c.close()


def _submits_counted(team: Yard) -> list[float]:
    """``batchyard_submit_latency_seconds_count`` as 12 scrapes see it, a new connection
    each (so both processes answer some)."""
    seen = []
    for _ in range(12):
        with httpx.Client(timeout=10) as fresh:
            text = fresh.get(team.url + "/metrics").text
        found = re.search(r"^batchyard_submit_latency_seconds_count (\S+)$", text, re.M)
        assert found, text[:2000]
        seen.append(float(found.group(1)))
    return seen


def test_metrics_report_the_whole_server(team: Yard) -> None:
    """/metrics answered by either process counts the submits both took (issue 38)."""
    before = _submits_counted(team)
    assert len(set(before)) == 1, before
    pids = set()
    for i in range(16):  # dry runs: submits that make no job, a new connection each
        with httpx.Client(base_url=team.url + "/api/v1", timeout=30,
                          headers={"Authorization": f"Bearer {team.token}"}) as fresh:
            answer = fresh.post("/workspaces/default/jobs", json={
                "spec": {"command": "true", "cluster": CLUSTER}, "name": f"dry-{i}",
                "dry_run": True})
            assert answer.status_code in (200, 201), answer.text
            pids.add(fresh.get("/health").json()["pid"])
    assert len(pids) == 2, pids  # both processes took some of them
    assert _submits_counted(team) == [before[0] + 16] * 12


def test_a_dead_worker_is_started_again(team: Yard) -> None:
    old = _workers(team)[0].pid
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: [p for p in _workers(team) if p.pid != old and p.is_running()], 60,
               what="the supervisor to start the worker again")
    name = "after-restart"
    job = team.write_job(name, {"name": name, "cluster": CLUSTER, "command": "echo fine"})
    team.ok("job", "create", "-f", str(job))
    assert team.wait_job(name, timeout=120)["state"] == "succeeded"


def test_kill_9_of_the_server_leaves_no_worker_behind(team: Yard) -> None:
    supervisor = team.server_pid
    workers = [p.pid for p in _workers(team)]
    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: not any(pid_alive(p) for p in [supervisor, *workers]), 30,
               what="the workers to die with their supervisor")
    team.start_server()
    assert len(_workers(team)) == 1
    assert team.job("after-restart")["state"] == "succeeded"


def test_control_updates_hold_one_lock_across_processes(
        postgres_database: Callable[[], str]) -> None:
    """Every transaction of a control session holds the advisory lock that the other
    processes take for theirs, and a commit inside it does not let it go for the next."""
    db = Database(postgres_database())
    db.migrate()
    held = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND objid = :k")
    key = channel.CONTROL_KEY & 0xFFFFFFFF

    def holders() -> int:
        with db.engine.connect() as other:
            return int(other.execute(held, {"k": key}).scalar() or 0)

    with channel.control_session(db) as session:
        session.execute(select(1))
        assert holders() == 1
        session.commit()
        assert holders() == 0
        session.execute(select(1))  # the next transaction takes it again
        assert holders() == 1
    assert holders() == 0
    db.engine.dispose()


def test_sqlite_refuses_more_than_one_process(tmp_path: Path) -> None:
    for sub in ("home", "work"):
        (tmp_path / sub).mkdir()
    y = Yard(tmp_path / "home", tmp_path / "work")
    y.env["BATCHYARD_DB_URL"] = f"sqlite:///{tmp_path / 'one.db'}"
    try:
        r = y.cli("server", "start", "--workers", "2")
        assert r.rc == 2 and "--workers" in r.stderr and "PostgreSQL" in r.stderr, str(r)
        r = y.cli("server", "start", "--workers", "none")
        assert r.rc == 2 and "--workers" in r.stderr, str(r)
        assert "Traceback" not in r.stderr
    finally:
        y.stop()
