"""The real Slurm harness (tests/slurmkit.py) does what the Slurm backend's tests rely on.

A session's cluster: slurmctld on host ``login``, slurmd on sn1, sn2 (1 GPU gres each) and sn3,
every host a namespace with its own address, hostname and private work dir. Checked: a 2-node
batch job whose srun runs one task in each node host; squeue --json while one job holds both
nodes of ``debug`` and another waits (reason Resources); scancel (SIGTERM reaches every task);
sinfo --json's node records; a slurmd killed with SIGKILL under a running 2-node job (job
NODE_FAIL, node DOWN "Not responding") and restarted (back in service, orphans reaped).

``SLURMKIT_SAMPLES=1`` also writes the JSON captured here to tests/unit/backends/data/ as
samples for the parser's unit tests. Root only (namespaces): skipped elsewhere. About 35 s.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from slurmkit import SlurmCluster, slurm

__all__ = ["slurm"]  # the imported fixture: pytest finds it by name in this module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SAMPLES = Path(__file__).resolve().parents[1] / "unit" / "backends" / "data"


def _capture(slurm: SlurmCluster, argv: list[str], sample: str) -> dict[str, Any]:
    """``argv --json`` parsed; with SLURMKIT_SAMPLES set, also saved verbatim as a sample."""
    text = slurm.json_text(argv)
    if os.environ.get("SLURMKIT_SAMPLES"):
        SAMPLES.mkdir(parents=True, exist_ok=True)
        (SAMPLES / f"slurm_{sample}.json").write_text(text)
    data: dict[str, Any] = json.loads(text)
    return data


def _nodes(sinfo: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in sinfo["nodes"]}


def test_cluster_started(slurm: SlurmCluster) -> None:
    print(f"\nslurm fixture start: {slurm.start_seconds:.2f}s (incl. a warm-up job)")
    assert slurm.node_states() == {"sn1": "idle", "sn2": "idle", "sn3": "idle"}
    assert slurm.login.name == "login" and set(slurm.nodes) == {"sn1", "sn2", "sn3"}
    assert len(set(slurm.addrs.values())) == 3
    assert all(slurm.slurmd_pid(n) for n in slurm.nodes)


def test_two_node_job_runs_a_task_in_each_node_host(slurm: SlurmCluster) -> None:
    script = ("#!/bin/sh\nsleep 0.3\n"
              "srun sh -c 'echo \"task $(hostname) $SLURM_NODEID $SLURM_PROCID "
              "$(hostname -I) gpu=$CUDA_VISIBLE_DEVICES\"; ls /var/lib/batchyard'\n")
    t0 = time.monotonic()
    job = slurm.sbatch(script, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1",
                       "--output=/var/lib/batchyard/out-%j.txt")
    slurm.wait_job(job, ("RUNNING", "COMPLETING", "COMPLETED"), timeout=15)
    print(f"\nsbatch -> running: {time.monotonic() - t0:.2f}s")
    assert slurm.wait_job(job, timeout=30) in ("COMPLETED", None)
    out = slurm.nodes["sn1"].read_file(f"out-{job}.txt").decode()  # sn1: the batch host
    tasks = [line.split() for line in out.splitlines() if line.startswith("task ")]
    assert sorted((t[1], t[2], t[4], t[5]) for t in tasks) == [
        ("sn1", "0", slurm.addrs["sn1"], "gpu=0"), ("sn2", "1", slurm.addrs["sn2"], "gpu=0")], out
    assert f"out-{job}.txt" in out.split()  # ls of sn1's private work dir
    with pytest.raises(FileNotFoundError):  # the other node's work dir is its own
        slurm.nodes["sn2"].read_file(f"out-{job}.txt")
    slurm.wait_idle(15)


def test_squeue_json_pending_reason_and_scancel(slurm: SlurmCluster) -> None:
    # holds every CPU of both debug nodes; its tasks report the SIGTERM scancel sends
    holder = slurm.sbatch(
        "srun sh -c 'trap \"echo TERM on $(hostname); exit 0\" TERM; "
        "while :; do sleep 0.1; done'\n",
        "--nodes=2", "--ntasks-per-node=4", "--gres=gpu:1",
        "--output=/var/lib/batchyard/hold-%j.txt")
    slurm.wait_job(holder, ("RUNNING",), timeout=15)
    _capture(slurm, ["squeue", "--all"], "squeue_running")
    _capture(slurm, ["sinfo"], "nodes")  # both debug nodes allocated (GPUs too), sn3 idle
    waiting = slurm.sbatch("true\n", "--nodes=2", "--job-name=waits")

    def reason() -> str | None:
        job = slurm.jobs().get(waiting, {})
        return job.get("state_reason") if job.get("state_reason") != "None" else None

    deadline = time.monotonic() + 15
    while not reason() and time.monotonic() < deadline:
        time.sleep(0.1)
    pending = _capture(slurm, ["squeue", "--all"], "squeue_pending")
    jobs = {j["job_id"]: j for j in pending["jobs"]}
    h, w = jobs[holder], jobs[waiting]
    assert (h["job_state"], h["nodes"], h["batch_host"], h["node_count"]) == \
        ("RUNNING", "sn[1-2]", "sn1", 2)
    assert h["partition"] == "debug" and h["cpus"] == 8 and h["exit_code"] == 0
    assert h["gres_detail"] == ["gpu:1(IDX:0)", "gpu:1(IDX:0)"]
    assert (w["job_state"], w["nodes"], w["batch_host"], w["name"]) == \
        ("PENDING", "", "", "waits")
    assert w["state_reason"] in ("Resources", "Priority")
    assert "meta" in pending and pending["errors"] == []

    slurm.run(["scancel", str(waiting)], check=True)
    assert slurm.wait_job(waiting, timeout=10) in ("CANCELLED", None)
    t0 = time.monotonic()
    slurm.run(["scancel", str(holder)], check=True)
    assert slurm.wait_job(holder, timeout=15) in ("CANCELLED", None)
    slurm.wait_idle(15)  # includes: no process of the job left in any node host
    print(f"\nscancel -> idle, no job process left: {time.monotonic() - t0:.2f}s")
    out = slurm.nodes["sn1"].read_file(f"hold-{holder}.txt").decode()
    assert sorted(set(re.findall(r"TERM on (\w+)", out))) == ["sn1", "sn2"], out


def test_sinfo_json_lists_nodes(slurm: SlurmCluster) -> None:
    sinfo = _capture(slurm, ["sinfo"], "sinfo")
    nodes = _nodes(sinfo)
    assert sorted(nodes) == ["sn1", "sn2", "sn3"]
    for name, n in nodes.items():
        assert (n["address"], n["hostname"], n["cpus"], n["real_memory"]) == \
            (slurm.addrs[name], name, 4, 4000)
        assert (n["state"], n["state_flags"], n["reason"]) == ("idle", [], "")
        assert n["gres"] == ("gpu:1" if name in ("sn1", "sn2") else "")
    assert nodes["sn3"]["partitions"] == ["wide"]
    assert sorted(nodes["sn1"]["partitions"]) == ["debug", "urgent", "wide"]
    assert sinfo["meta"]["Slurm"]["release"].startswith("22.05")


def test_killed_slurmd_fails_the_job_and_comes_back(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("srun sleep 300\n", "--nodes=2", "--no-requeue",
                       "--output=/var/lib/batchyard/kill-%j.txt")
    slurm.wait_job(job, ("RUNNING",), timeout=15)
    time.sleep(0.5)  # the step is launched on both nodes
    slurm.drain("sn3", "disk check")  # so the sample shows a drained node too
    t0 = time.monotonic()
    slurm.kill_slurmd("sn2")
    assert slurm.slurmd_pid("sn2") is None
    state = slurm.wait_job(job, ("NODE_FAIL", "FAILED", "CANCELLED"), timeout=40)
    print(f"\nslurmd SIGKILL -> job {state}: {time.monotonic() - t0:.1f}s")
    assert state == "NODE_FAIL"
    assert slurm.node_states()["sn2"] == "down*"
    down = _capture(slurm, ["sinfo"], "nodes_down")
    nodes = _nodes(down)
    assert (nodes["sn2"]["state"], nodes["sn2"]["reason"]) == ("down", "Not responding")
    assert "NOT_RESPONDING" in nodes["sn2"]["state_flags"]
    assert "DRAIN" in nodes["sn3"]["state_flags"] and nodes["sn3"]["reason"] == "disk check"
    j = slurm.jobs()[job]
    assert (j["job_state"], j["state_reason"]) == ("NODE_FAIL", "NodeDown")
    out = slurm.nodes["sn1"].read_file(f"kill-{job}.txt").decode()
    assert "Node failure on sn2" in out, out
    assert slurm.job_pids("sn2"), "the job's step on sn2 outlives its killed slurmd"

    t0 = time.monotonic()
    slurm.start_slurmd("sn2")
    print(f"start_slurmd -> node in service: {time.monotonic() - t0:.2f}s")
    slurm.resume("sn3")
    slurm.wait_idle(20)  # includes: the orphaned step on sn2 is reaped
    print(f"start_slurmd -> idle, orphans reaped: {time.monotonic() - t0:.2f}s")
    ok = slurm.sbatch("srun true\n", "-p", "wide", "--nodes=3", "--output=/dev/null")
    assert slurm.wait_job(ok, timeout=20) in ("COMPLETED", None)
    slurm.wait_idle(10)
