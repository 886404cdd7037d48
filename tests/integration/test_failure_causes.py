"""Failure causes in plain words, one real job per class on a real 2-node local cluster: the
first failing rank, its last error lines and the cause class reach the job's API view, its
attempt, ``job show`` and ``job wait``. Every job is submitted up front (they queue on the
cluster and run one after the other); each test waits for its own."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

import strictkit
from batchyard.sdk import Job, set_default_client
from yardkit import Yard, wait_until

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]

EXP = "causes"
NODE0, NODE1 = "local2-0", "local2-1"
PT = {"type": "pytorch", "processes_per_node": 1}

USER = """\
import os, time
rank = int(os.environ["RANK"])
print("rank", rank, "up", flush=True)
def train(step):
    raise ValueError(f"boom on rank {rank} at step {step}")
if rank == 3:
    time.sleep(1.0)
    train(7)
time.sleep(120)
"""

GLOO = """\
import os, time
from datetime import timedelta
import torch
import torch.distributed as dist
env = os.environ
dist.init_process_group("gloo", init_method=env["AZ_BATCHAI_PYTORCH_INIT_METHOD"],
                        rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                        timeout=timedelta(seconds=4))
if env["RANK"] == "1":
    time.sleep(120)  # never joins the all_reduce
dist.all_reduce(torch.ones(1))
"""

# A real kernel OOM kill: the rank is moved into a memory cgroup of 64 MiB (by the test: a job
# writes nothing outside its own folders, /sys/fs/cgroup included) and allocates more, under
# cgroup v1 (memory.limit_in_bytes, memory.oom_control) and v2 (memory.max, memory.events),
# where this host has a writable memory controller of that version.
_NAME = f"by-failure-test-{uuid.uuid4().hex[:8]}"
CGROUP_V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
CGROUPS: dict[str, Path] = {}


def _oom_kill(cgroup: Path) -> str:
    return (f'until grep -q "{cgroup.name}" /proc/self/cgroup; do sleep 0.1; done; '
            'exec python -c "x = bytearray(400 * 1024 * 1024); print(len(x))"')

JOBS: dict[str, dict[str, Any]] = {
    "user": {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
             "command": "python user.py"},
    "gloo": {"nodes": 2, "distribution": PT, "command": "python gloo.py"},
    "memerr": {"command": "prlimit --as=400000000 python -c "
                          "'x = bytearray(2 * 1024 ** 3)'"},
    "segv": {"command": "python -c 'import os, signal; print(\"going\", flush=True); "
                        "os.kill(os.getpid(), signal.SIGSEGV)'"},
    "wall": {"command": "sleep 60", "limits": {"max_wall_clock": 3, "grace_period": 1}},
    "exitwarn": {"command": "python exitwarn.py"},
    "prep": {"command": "true",
             "prepare": "echo preparing; echo 'cannot fetch the dataset' >&2; exit 3"},
}
# A rank that fails with its own message, then prints what PyTorch's ProcessGroupNCCL prints at
# exit when the process group was never destroyed (PyTorch 2.4+; the CPU build here has no
# NCCL, so the script prints PyTorch's line itself) and NCCL's INFO lines of a teardown.
EXITWARN = """\
import sys
print("fatal: checkpoint directory /ckpt is read-only", file=sys.stderr, flush=True)
print("vm:4242:4242 [0] NCCL INFO comm 0x55d1c0 rank 0 nranks 2 cudaDev 0 busId 18000 - "
      "Destroy COMPLETE", file=sys.stderr)
print("[rank0]:[W1204 20:11:45.123456789 ProcessGroupNCCL.cpp:1250] Warning: WARNING: "
      "destroy_process_group() was not called before program exit, which can leak resources. "
      "For more info, please see https://pytorch.org/docs/stable/distributed.html#shutdown "
      "(function operator())", file=sys.stderr)
sys.exit(2)
"""
# last: it runs until its test kills a launcher, and would hold the nodes from the jobs after it
LOST = {"nodes": 2, "distribution": PT, "command": "sleep 120", "limits": {"grace_period": 1}}


def _make_memory_cgroup(version: str) -> Path | None:
    """A 64 MiB memory cgroup of that version, or None where this host has none writable."""
    if version == "v1":
        roots, knob = [Path("/sys/fs/cgroup/memory")], "memory.limit_in_bytes"
    else:
        roots, knob = [r for r in CGROUP_V2_ROOTS if (r / "cgroup.controllers").exists()
                       and "memory" in (r / "cgroup.controllers").read_text().split()], \
            "memory.max"
    for root in roots:
        cgroup = root / _NAME
        try:
            if version == "v2":
                (root / "cgroup.subtree_control").write_text("+memory")
            cgroup.mkdir()
            (cgroup / knob).write_text(str(64 * 1024 * 1024))
        except OSError:
            if cgroup.is_dir():
                cgroup.rmdir()
            continue
        return cgroup
    return None


def _into_the_cgroup(url: str, token: str, name: str, cgroup: Path) -> None:
    """The rank's process (the child of its PID namespace's forwarder) into ``cgroup``, once it
    runs: what it forks next is in there."""
    from batchyard.node.pidns import forwarded

    http = httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"})

    def rank_pid() -> int | None:
        job = http.get(f"/workspaces/default/experiments/{EXP}/jobs/{name}").json()
        ranks = [r for n in (job["attempts"][-1:] or [{}])[0].get("nodes") or []
                 for r in n.get("ranks") or [] if r.get("pid") and r.get("rank", 0) >= 0]
        return (forwarded(ranks[0]["pid"]) or ranks[0]["pid"]) if ranks else None

    pid = wait_until(rank_pid, 240, 0.1, "the OOM job's rank")
    (cgroup / "cgroup.procs").write_text(str(pid))


@pytest.fixture(scope="module")
def submitted(yard: Yard, cluster2: str) -> dict[str, str]:
    jobs = dict(JOBS)
    for version in ("v1", "v2"):
        cgroup = _make_memory_cgroup(version)
        if cgroup is not None:
            CGROUPS[version] = cgroup
            jobs[f"oomkill-{version}"] = {"command": _oom_kill(cgroup)}
    jobs["lost"] = LOST
    names = {}
    folder = yard.write_job("fc-code", {"x": 1}, files={"user.py": USER, "gloo.py": GLOO,
                                                         "exitwarn.py": EXITWARN}).parent
    for key, body in jobs.items():  # over the API: nine CLI starts would cost half a minute
        name = f"fc-{key}"
        resp = yard.http.post("/workspaces/default/jobs", json={
            "spec": {"code": str(folder), **body}, "experiment": EXP, "name": name,
            "cluster": cluster2})
        assert resp.status_code == 201, resp.text
        names[key] = name
    for version, cgroup in CGROUPS.items():
        threading.Thread(target=_into_the_cgroup, daemon=True, args=(
            yard.url, yard.token, names[f"oomkill-{version}"], cgroup)).start()
    yield names
    for cgroup in CGROUPS.values():
        wait_until(lambda c=cgroup: not (c / "cgroup.procs").read_text().strip(), 30,
                   what="the OOM cgroup to empty")
        cgroup.rmdir()


def failed(yard: Yard, name: str, cause: str) -> dict[str, Any]:
    job = yard.wait_job(name, experiment=EXP, timeout=300)
    assert job["state"] == "failed", job
    error = job["error"]
    assert error and error["cause"] == cause, job
    assert f"({cause})" in job["message"], job["message"]
    attempt = yard.job(name, EXP)["attempts"][-1]
    assert attempt["error"]["cause"] == cause, attempt
    return job


def test_user_exception_on_rank_3_of_4(yard: Yard, submitted: dict[str, str]) -> None:
    job = failed(yard, submitted["user"], "user code error")
    error = job["error"]
    assert (error["rank"], error["node"], error["exit_code"]) == (3, NODE1, 1), error
    assert error["lines"][0].startswith("Traceback") and "in train" in "\n".join(error["lines"])
    assert error["lines"][-1] == "ValueError: boom on rank 3 at step 7", error
    assert job["message"] == (f"rank 3 on node {NODE1} exited with code 1 (user code error): "
                              "ValueError: boom on rank 3 at step 7"), job["message"]
    shown = yard.ok("job", "show", "-n", submitted["user"], "-e", EXP).stdout
    assert "user code error" in shown and f"rank 3 on node {NODE1}" in shown, shown
    assert "ValueError: boom on rank 3 at step 7" in shown and "Error lines" in shown, shown
    waited = yard.cli("job", "wait", "-n", submitted["user"], "-e", EXP)
    assert waited.rc == 1, waited
    assert "Failure cause" in waited.stdout and 'raise ValueError(f"boom' in waited.stdout, \
        waited
    as_json = yard.js("job", "show", "-n", submitted["user"], "-e", EXP)
    assert as_json["error"]["cause"] == "user code error"
    with pytest.MonkeyPatch.context() as mp:  # the SDK, as a user's script sees it
        mp.setenv("BATCHYARD_HOME", str(yard.home))
        for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN", "BATCHYARD_API"):
            mp.delenv(key, raising=False)
        set_default_client(None)
        try:
            got = Job.get(submitted["user"], EXP).error
        finally:
            set_default_client(None)
    assert got is not None and got["rank"] == 3 and got["lines"] == error["lines"], got
    with httpx.Client(base_url=yard.url, timeout=60) as portal:  # the job page's header
        signed = portal.post("/login", data={"token": yard.token, "next": "/"},
                             headers={"Origin": yard.url})
        assert signed.status_code == 303, signed.text
        page = portal.get(f"/ws/default/exp/{EXP}/jobs/{submitted['user']}")
        assert page.status_code == 200, page.text
        header = page.text[page.text.index('id="job-cause"'):]
        assert header.index("user code error") < header.index("ValueError: boom on rank 3")
        api = portal.get(f"/portal/api/ws/default/exp/{EXP}/jobs/{submitted['user']}").json()
        assert api["error"]["cause"] == "user code error", api


def test_gloo_timeout_by_a_rank_that_never_joins(yard: Yard,
                                                 submitted: dict[str, str]) -> None:
    job = failed(yard, submitted["gloo"], "nccl/gloo timeout")
    assert (job["error"]["rank"], job["error"]["node"]) == (0, NODE0), job["error"]
    assert "Timed out" in job["error"]["summary"], job["error"]


def test_memory_error_under_an_address_space_limit(yard: Yard,
                                                   submitted: dict[str, str]) -> None:
    job = failed(yard, submitted["memerr"], "oom")
    assert job["error"]["lines"][-1] == "MemoryError", job["error"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_kernel_oom_kill_in_a_memory_cgroup(yard: Yard, submitted: dict[str, str],
                                              version: str) -> None:
    """Each cgroup version where this host has one (a host has v1's memory controller or
    v2's, rarely both: tests/unit/node/test_oom_cgroups.py reads both everywhere); under
    CI, a host with neither fails."""
    if f"oomkill-{version}" not in submitted:
        if not CGROUPS:
            strictkit.missing("no writable memory cgroup (v1 or v2) here: run as root")
        pytest.skip(f"no writable cgroup {version} memory controller on this host")
    job = failed(yard, submitted[f"oomkill-{version}"], "oom")
    assert job["exit_code"] == 137 and job["error"]["rank"] == 0, job
    assert "out of memory" in job["error"]["summary"], job["error"]


def test_a_rank_killed_by_a_signal(yard: Yard, submitted: dict[str, str]) -> None:
    job = failed(yard, submitted["segv"], "signal 11")
    assert job["error"]["summary"] == "killed by SIGSEGV", job["error"]
    assert job["error"]["exit_code"] == 128 + signal.SIGSEGV


def test_wall_clock(yard: Yard, submitted: dict[str, str]) -> None:
    job = failed(yard, submitted["wall"], "wall clock")
    assert "exceeded max wall clock time of 3s" in job["message"], job["message"]


def test_exit_warnings_are_not_the_error(yard: Yard, submitted: dict[str, str]) -> None:
    job = failed(yard, submitted["exitwarn"], "user code error")
    error = job["error"]
    assert error["summary"] == "fatal: checkpoint directory /ckpt is read-only", error
    assert error["lines"] == ["fatal: checkpoint directory /ckpt is read-only"], error
    assert job["message"].endswith("(user code error): fatal: checkpoint directory /ckpt is "
                                   "read-only"), job["message"]


def test_preparation_failed(yard: Yard, submitted: dict[str, str]) -> None:
    job = failed(yard, submitted["prep"], "preparation failed")
    assert job["error"]["what"] == "prepare" and job["error"]["exit_code"] == 3, job["error"]
    assert job["error"]["lines"] == ["cannot fetch the dataset"], job["error"]
    shown = yard.ok("job", "show", "-n", submitted["prep"], "-e", EXP).stdout
    assert "preparation failed" in shown and "cannot fetch the dataset" in shown, shown


def test_node_lost_when_its_launcher_is_killed(yard: Yard, submitted: dict[str, str]) -> None:
    name = submitted["lost"]
    yard.wait_job(name, ("running",), experiment=EXP, timeout=300)
    wait_until(lambda: all(r.get("pid") for r in yard.node_reports(yard.job(name, EXP))), 20,
               what="both launchers to report their pid")
    os.kill(int(yard.node_reports(yard.job(name, EXP))[1]["pid"]), signal.SIGKILL)
    job = failed(yard, name, "node lost")
    assert job["error"]["node"] == NODE1 and "died" in job["message"], job
    shown = yard.ok("job", "show", "-n", name, "-e", EXP).stdout
    assert "node lost" in shown and NODE1 in shown, shown


def test_a_preempted_attempt_records_its_cause(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "fclow", "-s", "Standard_D2_v2", "-t", "1",
            "--vm-priority", "lowpriority", "--provisioning-delay", "1")
    yard.wait_cluster("fclow", 1)
    command = 'if [ "$BATCHYARD_ATTEMPT" = 1 ]; then sleep 120; fi'  # the second one ends
    path = yard.write_job("fc-preempt", {"name": "fc-preempt", "experiment": EXP,
                                         "command": command,
                                         "limits": {"grace_period": 1, "checkpoint_notice": 2}})
    yard.ok("job", "create", "-f", str(path), "-c", "fclow")
    yard.wait_job("fc-preempt", ("running",), experiment=EXP, timeout=120)
    yard.ok("cluster", "node", "preempt", "-c", "fclow", "-n", "fclow-0")
    done = yard.wait_job("fc-preempt", experiment=EXP, timeout=120)
    assert done["state"] == "succeeded" and done["error"] is None, done
    first = yard.job("fc-preempt", EXP)["attempts"][0]
    assert first["state"] == "preempted" and first["error"]["cause"] == "preempted", first
    assert first["error"]["node"] == "fclow-0", first
    events = yard.job("fc-preempt", EXP)["events"]
    assert any("(preempted)" in (e["message"] or "") for e in events), events
    shown = yard.ok("job", "show", "-n", "fc-preempt", "-e", EXP).stdout
    assert "Attempt 1 cause" in shown and "preempted" in shown, shown
