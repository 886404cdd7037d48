"""Crash safety: `kill -9` of the server while a 2-node job runs, another waits behind it and a
third fails while no server is there; then `batchyard server start`. The running job is
re-attached and every job ends in its true state, each rank having run exactly once, in
attempt 1: none is lost, none runs twice.

The ranks wait for a "go" file rather than sleeping a fixed time, so the test decides when
each job ends (deterministic on a loaded machine, and no longer than it must be)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from yardkit import Yard, pid_alive, wait_until

pytestmark = [pytest.mark.timeout(150)]

# Each rank appends one "start" line at once and one "done" line when released (O_APPEND: the
# lines of concurrent ranks do not mix).
COMMAND = (
    'echo "$RANK $$ $BATCHYARD_ATTEMPT" >> "$MARKS/$BATCHYARD_JOB_NAME.start"; '
    'echo "rank $RANK started"; '
    'while [ ! -e "$MARKS/go-$BATCHYARD_JOB_NAME" ]; do sleep 0.1; done; '
    'echo "$RANK $$ $BATCHYARD_ATTEMPT" >> "$MARKS/$BATCHYARD_JOB_NAME.done"; '
    'echo "rank $RANK done"'
)


def submit(yard: Yard, name: str, marks: Path, nodes: int, ppn: int, cluster: str,
           then: str = "") -> None:
    job_file = yard.write_job(name, {
        "name": name, "nodes": nodes, "command": COMMAND + then,
        "distribution": {"type": "pytorch", "processes_per_node": ppn},
        "env": {"MARKS": str(marks)},
        "mounts": [{"kind": "local", "relative_path": "marks", "source": str(marks)}],
    })
    yard.ok("job", "create", "-f", str(job_file), "-c", cluster)


def lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def rank_host_pids(node_dirs: list[Path]) -> list[int]:
    """The ranks' pids as the launchers recorded them: on this host. A rank's own ``$$`` is
    its pid in the attempt's PID namespace, not one that /proc here can tell about."""
    files = [f for d in node_dirs for f in sorted((d / ".batchyard").glob("node-*.status.json"))]
    return [int(r["pid"]) for f in files for r in json.loads(f.read_text()).get("ranks", [])
            if r.get("pid")]


def launcher_states(node_dirs: list[Path]) -> list[str]:
    """What each launcher recorded on its own node (no server to report to meanwhile)."""
    files = [f for d in node_dirs for f in sorted((d / ".batchyard").glob("node-*.status.json"))]
    return [json.loads(f.read_text()).get("state", "?") for f in files]


@pytest.mark.slow
def test_kill_9_and_restart_with_running_queued_and_finishing_jobs(yard, cluster2, tmp_path):
    marks, _mount = yard.exchange("marks")  # the ranks write there: a local mount of theirs
    yard.ok("cluster", "create", "-n", "solo", "-s", "Standard_D2_v2", "-t", "1")
    submit(yard, "long", marks, nodes=2, ppn=2, cluster=cluster2)    # takes both nodes
    submit(yard, "behind", marks, nodes=2, ppn=1, cluster=cluster2)  # queued behind it
    submit(yard, "dies", marks, nodes=1, ppn=1, cluster="solo", then="; exit 4")
    wait_until(lambda: len(lines(marks / "long.start")) == 4
               and len(lines(marks / "dies.start")) == 1, 60,
               what="all 4 ranks of `long` and the rank of `dies` to start")
    behind = yard.job("behind")
    assert behind["state"] == "queued", behind
    long_dirs = yard.node_attempt_dirs(yard.job("long"))  # each node's own
    dies_dirs = yard.node_attempt_dirs(yard.job("dies"))
    wait_until(lambda: len(rank_host_pids(long_dirs + dies_dirs)) == 5, 20,
               what="the launchers to record the 5 ranks' pids")
    rank_pids = rank_host_pids(long_dirs + dies_dirs)

    old_pid, old_url = yard.server_pid, yard.url
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(old_pid), 10, what="the server to die")
    # the ranks do not depend on the server
    assert all(pid_alive(p) for p in rank_pids), "ranks died with the server:\n" + "\n".join(
        f"{f.name}: {f.read_text()}" for d in long_dirs for f in sorted(d.glob("*/*"))
        if f.is_file() and f.name.endswith(("launcher.txt", ".status.json", "stderr.txt")))

    # `dies` fails while no server watches; its launcher records it
    (marks / "go-dies").touch()
    wait_until(lambda: launcher_states(dies_dirs) == ["failed"], 20,
               what="the launcher of `dies` to record its failure")
    assert launcher_states(long_dirs) == ["running", "running"]

    # back at the address the launchers' tickets name (a server on its fixed port; here the
    # port the first one happened to get), so they deliver what they kept meanwhile
    yard.start_server(port=int(old_url.rsplit(":", 1)[1]))
    assert yard.server_pid != old_pid and yard.url == old_url
    dies = yard.wait_job("dies", timeout=20)
    assert dies["state"] == "failed" and dies["exit_code"] == 4, dies
    assert yard.job("long")["state"] == "running"  # re-attached, still running
    assert yard.job("behind")["state"] == "queued"

    (marks / "go-long").touch()
    (marks / "go-behind").touch()
    long = yard.wait_job("long", timeout=30)
    behind = yard.wait_job("behind", timeout=30)
    assert long["state"] == "succeeded", long
    assert behind["state"] == "succeeded", behind
    for job, ranks in ((long, 4), (behind, 2), (dies, 1)):
        name = job["name"]
        assert job["attempt"] == 1 and [a["number"] for a in job["attempts"]] == [1], job
        started = lines(marks / f"{name}.start")
        done = lines(marks / f"{name}.done")
        # exactly one start and one end per rank, all in attempt 1, by the same processes
        assert sorted(int(f[0]) for f in started) == list(range(ranks)), started
        assert sorted(int(f[0]) for f in done) == list(range(ranks)), done
        assert {f[2] for f in started + done} == {"1"}
        assert {f[1] for f in started} == {f[1] for f in done}
        # every line reached the server's copy of the logs exactly once, those written while
        # no server was there included
        logs = yard.ok("job", "logs", "-n", name).stdout
        for rank in range(ranks):
            assert logs.count(f"rank {rank} started\n") == 1, logs
            assert logs.count(f"rank {rank} done\n") == 1, logs
    # `behind` only ran once `long` had released the nodes
    assert behind["started_at"] >= long["ended_at"] - 0.5
    # the restarted server answers the CLI as before
    listed = {j["name"]: j["state"] for j in yard.js("job", "list")}
    assert listed == {"long": "succeeded", "behind": "succeeded", "dies": "failed"}
