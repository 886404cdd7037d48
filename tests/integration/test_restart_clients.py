"""Clients across a server restart (issue 33, items 5 and 8).

* `job logs` of a queued job said "not found" (exit 3): it says that the job is queued and
  why (its pending reason), and `-f` waits for its lines.
* 100 clients submitting while the server restarts all succeed, each job made once: a refused
  connection is tried again for ~10 s when the home says a server is expected (and followed to
  the port the restarted server took), under the idempotency key submits carry.
* A follower (`job logs -f`, the SDK's `logs(follow=True)`) whose stream breaks reconnects
  and prints every line exactly once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(300)
LINES = 60


@pytest.fixture(scope="module")
def one(yard: Yard) -> str:
    yard.ok("cluster", "create", "-n", "one", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("one", 1)
    return "one"


def _job(yard: Yard, name: str, command: str, cluster: str) -> None:
    path = yard.write_job(name, {"name": name, "command": command,
                                 "distribution": {"type": "custom"}})
    yard.ok("job", "create", "-f", str(path), "-c", cluster)


def _popen(yard: Yard, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "batchyard.cli.main", *args], env=yard.env,
                            cwd=yard.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)


def _counting(count: int, gate: Path | None = None) -> str:
    """A command printing ``line 1`` .. ``line N`` at ~15 lines/s (after ``gate`` exists)."""
    wait = f'until [ -e {gate} ]; do sleep 0.05; done; ' if gate else ""
    return f'{wait}for i in $(seq 1 {count}); do echo "line $i"; sleep 0.07; done'


def _printed_once(out: str, count: int) -> None:
    got = [line.rsplit(" ", 1)[-1] for line in out.splitlines() if "line " in line]
    assert got == [str(i) for i in range(1, count + 1)], got


def test_logs_of_a_queued_job_say_why_and_follow_waits(yard: Yard, one: str) -> None:
    go = yard.work / "go-queued"
    _job(yard, "ahead", f"until [ -e {go} ]; do sleep 0.05; done", one)
    yard.wait_job("ahead", ("running",), timeout=60)
    _job(yard, "later", _counting(5), one)
    assert yard.job("later")["state"] == "queued"
    said = yard.cli("job", "logs", "-n", "later")
    assert said.rc == 0, str(said)
    assert "is queued" in said.stderr and "held by ahead" in said.stderr, str(said)
    assert "not found" not in said.stderr, str(said)
    follower = _popen(yard, "job", "logs", "-n", "later", "-f")
    time.sleep(2)
    assert follower.poll() is None, follower.communicate()  # waiting for its lines
    go.touch()
    out, err = follower.communicate(timeout=90)
    assert follower.returncode == 0, err
    _printed_once(out, 5)
    assert "succeeded" in err, err


def test_100_clients_submitting_during_a_restart_all_succeed_once(yard: Yard, one: str,
                                                                   monkeypatch) -> None:
    from batchyard.client import local_server
    from batchyard.client.http import Client

    monkeypatch.setenv("BATCHYARD_HOME", str(yard.home))
    for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN", "BATCHYARD_DB_URL"):
        monkeypatch.delenv(key, raising=False)
    if yard.env.get("BATCHYARD_DB_URL"):
        monkeypatch.setenv("BATCHYARD_DB_URL", yard.env["BATCHYARD_DB_URL"])
    go = yard.work / "go-clients"
    _job(yard, "hold", f"until [ -e {go} ]; do sleep 0.1; done", one)  # runs across it
    yard.wait_job("hold", ("running",), timeout=60)
    yard.ok("cluster", "create", "-n", "parked", "-s", "Standard_D2_v2", "-t", "0")
    clients = [Client.connect(autostart=False) for _ in range(100)]
    old_url = yard.url
    started = threading.Event()
    results: dict[int, object] = {}

    def submit(i: int) -> None:
        started.wait()
        time.sleep(i * 0.04)  # spread over the restart
        try:
            results[i] = clients[i].submit("/workspaces/default/jobs", {
                "spec": {"command": "true", "distribution": {"type": "custom"},
                         "env": {"CLIENT": str(i)}},
                "experiment": "burst", "cluster": "parked"})  # they queue there
        except Exception as exc:  # (the test reports what each one got)
            results[i] = exc

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    started.set()
    # what `server stop` and `server start --port 0` do (in this process: the CLI's own
    # start-up is not what is measured); port 0: another port, as when the home's is taken
    assert local_server.stop()
    local_server.start(port=0)
    for t in threads:
        t.join(120)
    yard._reset_http()
    failed = {i: r for i, r in results.items() if isinstance(r, Exception)}
    assert len(results) == 100 and not failed, failed
    assert yard.url != old_url
    listed = yard.js("job", "list", "-e", "burst")
    marks = Counter(j["name"] for j in listed)
    assert len(listed) == 100 and max(marks.values()) == 1, marks
    clients_seen = Counter(yard.job(j["name"], "burst")["spec"]["env"]["CLIENT"]
                           for j in listed)
    assert sorted(clients_seen) == sorted(str(i) for i in range(100)), clients_seen
    assert set(clients_seen.values()) == {1}  # each client's job exactly once
    go.touch()  # the job that ran across the restart (on another port) ends: its launcher
    # found the server where it went (item 6)
    assert yard.wait_job("hold", timeout=60)["state"] == "succeeded"


@pytest.fixture
def restart_later(yard: Yard) -> Iterator[threading.Thread]:
    """Restart the server on its port 2 s from now (the launchers' tickets name it)."""
    port = int(yard.url.rsplit(":", 1)[1])

    def restart() -> None:
        time.sleep(2)
        yard.ok("server", "stop")
        time.sleep(1)
        yard.start_server(port=port)

    thread = threading.Thread(target=restart)
    yield thread
    if thread.ident is not None:
        thread.join(120)


def test_followers_reconnect_and_print_every_line_once(yard: Yard, one: str,
                                                       restart_later: threading.Thread,
                                                       monkeypatch) -> None:
    from batchyard.client.http import Client
    from batchyard.sdk import set_default_client
    from batchyard.sdk.job import Job

    go = yard.work / "go-follow"
    _job(yard, "chatty", _counting(LINES, go), one)
    yard.wait_job("chatty", ("running",), timeout=60)
    cli = _popen(yard, "job", "logs", "-n", "chatty", "-f")
    monkeypatch.setenv("BATCHYARD_HOME", str(yard.home))
    monkeypatch.delenv("BATCHYARD_SERVER", raising=False)
    sdk_lines: list[str] = []
    client = Client.connect(autostart=False)
    set_default_client(client)
    try:
        job = Job("default", "default", "chatty", client=client)

        def read() -> None:
            sdk_lines.extend(job.logs(follow=True))

        reader = threading.Thread(target=read)
        reader.start()
        go.touch()
        restart_later.start()
        restart_later.join(120)
        reader.join(120)
    finally:
        set_default_client(None)
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 0, err
    _printed_once(out, LINES)
    assert "reconnecting" in err, err  # it did lose its stream
    _printed_once("".join(sdk_lines), LINES)
    wait_until(lambda: yard.job("chatty")["state"] == "succeeded", 30)
