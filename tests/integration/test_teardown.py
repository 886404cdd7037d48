"""Nothing of a job survives its end: fail-fast when one rank fails, `job terminate`, and the
wall-clock limit, on real 2 nodes x 2 processes jobs whose ranks fight back (ignore SIGTERM,
hide a grandchild in its own session). Checked by the recorded pids and by scanning /proc for
the attempt's process tag."""

from __future__ import annotations

from pathlib import Path

import pytest

from yardkit import Yard, host_pid, pid_alive, tagged_pids, wait_until

pytestmark = pytest.mark.timeout(120)

# pids as a job records them: its own and its PID namespace's (yardkit.host_pid)
ME = "$$ $(stat -Lc %i /proc/self/ns/pid)"
FAIL_FAST = (
    f'echo "{ME}" > "$AZ_BATCHAI_SHARED_JOB_TEMP/pid-$RANK"; '
    'if [ "$RANK" = 3 ]; then sleep 1; date +%s.%N > "$AZ_BATCHAI_SHARED_JOB_TEMP/failed_at"; '
    'exit 3; fi; sleep 60'
)

# A rank that ignores SIGTERM, with a python child that ignores it too and keeps a grandchild
# in a session of its own (out of reach of process-group signals).
STUBBORN_COMMAND = (
    "trap '' TERM; python stubborn.py & "
    f'echo "{ME}" > "$AZ_BATCHAI_SHARED_JOB_TEMP/bash-$RANK"; sleep 1000'
)
STUBBORN_PY = """\
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen(
    [sys.executable, "-c",
     "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"],
    start_new_session=True)
shared = os.environ["AZ_BATCHAI_SHARED_JOB_TEMP"]
path = os.path.join(shared, "pids-" + os.environ["RANK"])
with open(path + ".tmp", "w") as fh:
    ns = os.stat("/proc/self/ns/pid").st_ino
    fh.write("%d %d\\n%d %d" % (os.getpid(), ns, grandchild.pid, ns))
os.replace(path + ".tmp", path)
print("stubborn rank", os.environ["RANK"], "ready", flush=True)
time.sleep(1000)
"""


def spec(name: str, command: str, **limits: float) -> dict:
    return {"name": name, "nodes": 2, "code": ".", "command": command,
            "distribution": {"type": "pytorch", "processes_per_node": 2},
            "limits": {"grace_period": 2, **limits}}


def rank_shared(yard: Yard, job: dict) -> list[Path]:
    """$AZ_BATCHAI_SHARED_JOB_TEMP of each global rank: its node's own (2 ranks per node;
    nodes share no disk)."""
    shared = [d / "shared" for d in yard.node_attempt_dirs(job)]
    return [shared[rank // 2] for rank in range(4)]


def stubborn_pids(shared: list[Path]) -> list[int | None]:
    """bash, python child and setsid grandchild of every rank, once all 4 ranks are up (as
    this host sees them)."""
    pids = []
    for rank in range(4):
        pids.append(host_pid((shared[rank] / f"bash-{rank}").read_text()))
        pids += [host_pid(p) for p in
                 (shared[rank] / f"pids-{rank}").read_text().splitlines()]
    return pids


def start_stubborn(yard: Yard, name: str, **limits: float) -> tuple[list[int], str]:
    job_file = yard.write_job(name, spec(name, STUBBORN_COMMAND, **limits),
                              files={"stubborn.py": STUBBORN_PY})
    yard.ok("job", "create", "-f", str(job_file), "-c", "local2")
    yard.wait_job(name, ("running",), timeout=30)
    shared = rank_shared(yard, yard.job(name))
    wait_until(lambda: all((shared[r] / f"pids-{r}").exists()
                           and (shared[r] / f"bash-{r}").exists()
                           for r in range(4)), 20, what="all stubborn ranks to be up")
    found = stubborn_pids(shared)
    pids = [p for p in found if p is not None]
    assert len(pids) == 12 and all(pid_alive(p) for p in pids), found
    uuid = yard.job(name)["attempts"][-1]["uuid"]
    assert len(tagged_pids(uuid)) >= 12  # the tag scan sees every one of them
    return pids, uuid


def test_fail_fast_one_failing_rank_tears_down_the_gang(yard, cluster2):
    job_file = yard.write_job("failfast", spec("failfast", FAIL_FAST))
    yard.ok("job", "create", "-f", str(job_file), "-c", cluster2)
    job = yard.wait_job("failfast", timeout=40)
    shared = rank_shared(yard, job)
    failed_at = float((shared[3] / "failed_at").read_text())
    took = job["ended_at"] - failed_at
    print(f"fail-fast: job failed {took:.2f}s after rank 3 exited")
    assert job["state"] == "failed", job
    assert took < 10, f"job failed {took:.1f}s after the rank failed"
    assert job["exit_code"] == 3
    message = job["message"]
    assert "local2-1" in message and "rank 3" in message and "code 3" in message, message
    rank_pids = [host_pid((shared[r] / f"pid-{r}").read_text()) for r in range(4)]
    yard.assert_no_process_left(job, [p for p in rank_pids if p is not None])
    # the sleeping ranks were stopped, not left to finish: the job took far less than 60 s
    assert job["ended_at"] - job["started_at"] < 30
    waited = yard.cli("job", "wait", "-n", "failfast")
    assert waited.rc == 3, str(waited)
    assert "rank 3" in yard.ok("job", "show", "-n", "failfast").stdout


def test_terminate_kills_sigterm_ignoring_ranks_and_grandchildren(yard, cluster2):
    pids, uuid = start_stubborn(yard, "stubborn-term")
    out = yard.js("job", "terminate", "-n", "stubborn-term")  # waits until it has ended
    assert out["state"] == "canceled", out
    job = yard.job("stubborn-term")
    assert job["state"] == "canceled" and "terminated by user" in job["message"]
    asked = next(e["ts"] for e in job["events"] if e["message"] == "terminate requested")
    took = job["ended_at"] - asked
    print(f"terminate: job ended {took:.2f}s after the request (grace 2 s)")
    assert 1.5 < took < 12  # the ranks ignore SIGTERM: the grace period is used in full
    yard.assert_no_process_left(job, pids)
    assert not tagged_pids(uuid)
    logs = yard.ok("job", "logs", "-n", "stubborn-term").stdout
    assert logs.count("ready") == 4


def test_wall_clock_limit_kills_everything(yard, cluster2):
    pids, uuid = start_stubborn(yard, "stubborn-clock", max_wall_clock=3)
    job = yard.wait_job("stubborn-clock", timeout=40)
    assert job["state"] == "failed", job
    assert "wall clock" in job["message"], job["message"]
    ran = job["ended_at"] - job["started_at"]
    print(f"wall clock: job ran {ran:.2f}s with max_wall_clock 3 s, grace 2 s")
    assert 2.5 <= ran < 15
    yard.assert_no_process_left(job, pids)
    assert not tagged_pids(uuid)
    waited = yard.cli("job", "wait", "-n", "stubborn-clock")
    assert waited.rc == 1, str(waited)  # failed without an exit code of its own
