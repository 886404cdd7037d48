"""Launchers and a server that went away (issue 33, item 6).

* A server restarted on another port finishes the jobs that were running: their launchers
  find its new address in the home (server.json), and the queue behind them moves.
* A server that restarts (or takes the lease over) notices the launchers of running attempts
  it never hears from: after the cluster's heartbeat timeout their attempt is stopped and the
  job requeued (or failed) naming the cause, their nodes freed, and the silent launcher and its
  ranks killed before anything runs again. Here a launcher is frozen (SIGSTOP) across a kill -9
  of the server: alive to a pid check, and silent.
* A launcher whose server is gone ignored SIGTERM and waited forever to deliver its last
  report: it stops its ranks with the grace period, keeps its spool (the log files on its
  node), and exits; the server, once back, ends the job and takes the lines from the spool."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from yardkit import Yard, pid_alive, wait_until

pytestmark = pytest.mark.timeout(300)


def _kill_server(yard: Yard) -> int:
    port = int(yard.url.rsplit(":", 1)[1])
    pid = yard.server_pid
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 20, what="the server to die")
    return port


def _launcher_pid(yard: Yard, name: str) -> int:
    reports = wait_until(lambda: [r for r in yard.node_reports(yard.job(name))
                                  if r.get("pid") and r.get("ranks")], 30,
                         what=f"{name}'s launcher to report its ranks")
    return int(reports[0]["pid"])


def test_a_silent_launcher_after_a_restart_is_lost_and_its_job_requeued(yard: Yard,
                                                                        tmp_path: Path) -> None:
    yard.ok("cluster", "create", "-n", "quiet", "-s", "Standard_D2_v2", "-t", "1",
            "--heartbeat-timeout", "8")
    yard.wait_cluster("quiet", 1)
    folder, mount = yard.exchange("marks")  # a job writes nowhere but its folders and mounts
    marks = folder / "attempts"
    job = yard.write_job("frozen", {
        "name": "frozen", "distribution": {"type": "custom"}, "limits": {"max_retries": 1},
        "mounts": [mount],
        "command": f'echo "$BATCHYARD_ATTEMPT" >> {marks}; '
                   'if [ "$BATCHYARD_ATTEMPT" = 1 ]; then sleep 600; fi; echo done'})
    yard.ok("job", "create", "-f", str(job), "-c", "quiet")
    yard.wait_job("frozen", ("running",), timeout=60)
    launcher = _launcher_pid(yard, "frozen")
    ranks = [int(r["pid"]) for r in yard.node_reports(yard.job("frozen"))[0]["ranks"]]
    port = _kill_server(yard)
    os.kill(launcher, signal.SIGSTOP)  # alive, and silent
    try:
        yard.start_server(port=port)
        started = time.monotonic()
        done = yard.wait_job("frozen", timeout=120)
        assert time.monotonic() - started >= 7, "lost before the heartbeat timeout"
        assert done["state"] == "succeeded", done
        first, second = done["attempts"]
        assert first["state"] in ("failed", "preempted"), first
        assert "not heard from" in (first["message"] or ""), first
        assert second["state"] == "succeeded"
        assert marks.read_text().split() == ["1", "2"]  # the first never ran on
        assert not pid_alive(launcher) and not any(pid_alive(p) for p in ranks)
        assert yard.cluster("quiet")["node_counts"]["idle"] == 1
    finally:
        if pid_alive(launcher):
            os.kill(launcher, signal.SIGKILL)


def test_a_launcher_that_lost_its_server_stops_on_sigterm(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "orphan", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("orphan", 1)
    job = yard.write_job("stranded", {
        "name": "stranded", "distribution": {"type": "custom"},
        "limits": {"grace_period": 3},
        "command": 'for i in $(seq 1 30); do echo "line $i"; done; '
                   'trap \'echo "got TERM"; exit 143\' TERM; '
                   'while true; do sleep 0.1; done'})
    yard.ok("job", "create", "-f", str(job), "-c", "orphan")
    yard.wait_job("stranded", ("running",), timeout=60)
    wait_until(lambda: yard.ok("job", "logs", "-n", "stranded").stdout.count("line ") == 30,
               30, what="the first lines to reach the server")
    launcher = _launcher_pid(yard, "stranded")
    node_dir = yard.node_attempt_dirs(yard.job("stranded"))[0]
    ranks = [int(r["pid"]) for r in yard.node_reports(yard.job("stranded"))[0]["ranks"]]
    port = _kill_server(yard)
    time.sleep(1)
    os.kill(launcher, signal.SIGTERM)
    wait_until(lambda: not pid_alive(launcher), 30,
               what="the launcher to stop on SIGTERM without its server")
    assert not any(pid_alive(p) for p in ranks)
    spool = list((node_dir / "stdouterr").glob("*.stdout.txt"))
    assert spool and any("got TERM" in p.read_text() for p in spool), spool  # kept
    yard.start_server(port=port)
    done = yard.wait_job("stranded", timeout=90)
    assert done["state"] == "failed", done
    out = yard.ok("job", "logs", "-n", "stranded").stdout
    got = [line.rsplit(" ", 1)[-1] for line in out.splitlines() if "line " in line]
    assert got == [str(i) for i in range(1, 31)], out
    wait_until(lambda: "got TERM" in yard.ok("job", "logs", "-n", "stranded").stdout, 30,
               what="the spooled last line to reach the server")


def test_a_server_restarted_on_another_port_finishes_the_running_jobs(yard: Yard,
                                                                      tmp_path: Path) -> None:
    """`server stop`, then `server start` while the home's port is taken: the server comes
    back on another port. The launchers finished their ranks but reported to the old address,
    and the job stayed `running` (2 m 33 s and more for a 20 s command), holding both nodes
    while the queue behind it waited. They find the new address in the home."""
    yard.ok("cluster", "create", "-n", "moved", "-s", "Standard_D2_v2", "-t", "2")
    yard.wait_cluster("moved", 2)
    go = tmp_path / "go"
    first = yard.write_job("across", {
        "name": "across", "nodes": 2, "distribution": {"type": "pytorch",
                                                       "processes_per_node": 1},
        "command": f'echo "rank $RANK before"; until [ -e {go} ]; do sleep 0.1; done; '
                   'echo "rank $RANK after"'})
    yard.ok("job", "create", "-f", str(first), "-c", "moved")
    yard.wait_job("across", ("running",), timeout=60)
    behind = yard.write_job("behind", {"name": "behind", "nodes": 2,
                                       "command": 'echo "behind ran"'})
    yard.ok("job", "create", "-f", str(behind), "-c", "moved")
    old = yard.url
    yard.ok("server", "stop")
    yard.start_server()  # port 0: any other port
    assert yard.url != old
    go.touch()
    done = yard.wait_job("across", timeout=90)
    assert done["state"] == "succeeded" and len(done["attempts"]) == 1, done
    logs = yard.ok("job", "logs", "-n", "across").stdout
    for rank in (0, 1):
        assert logs.count(f"rank {rank} before") == 1 and logs.count(f"rank {rank} after") \
            == 1, logs
    assert yard.wait_job("behind", timeout=90)["state"] == "succeeded"
