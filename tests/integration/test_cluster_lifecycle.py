"""Clusters that behave like AML Compute, on the real local backend: autoscale, resize with
each deallocation option, setup tasks, quotas, rejection at submit, priorities and backfill,
and low-priority preemption with requeue from a checkpoint."""

from __future__ import annotations

import time

import pytest

from yardkit import Yard, wait_until

SLEEPER = """\
import os, sys, time
time.sleep(float(sys.argv[1]))
print("rank", os.environ["RANK"], "done")
"""

CHECKPOINTER = """\
#!/bin/bash
f="$BATCHYARD_CHECKPOINT_DIR/step-$RANK"
n=$(cat "$f" 2>/dev/null || echo 0)
echo "attempt $BATCHYARD_ATTEMPT rank $RANK resumes at $n"
trap 'echo $n > "$f"; echo "checkpointed at $n"; exit 143' TERM
while [ "$n" -lt 25 ]; do n=$((n+1)); sleep 0.2; done
echo "rank $RANK finished at $n"
"""


def _sleep_job(yard: Yard, name: str, seconds: float, nodes: int = 1, **extra: object) -> str:
    spec = {"name": name, "nodes": nodes, "code": ".",
            "command": f"python sleeper.py {seconds}", **extra}
    return str(yard.write_job(name, spec, {"sleeper.py": SLEEPER}))


def test_autoscale_from_zero_to_two_and_back(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "auto", "-s", "Standard_D2_v2", "--min", "0", "--max",
            "2", "--idle-seconds-before-scaledown", "2", "--provisioning-delay", "1")
    assert yard.cluster("auto")["current_nodes"] == 0
    yard.ok("job", "create", "-f", _sleep_job(yard, "grow", 0.5, nodes=2), "-c", "auto")
    queued = yard.job("grow")
    assert queued["state"] == "queued" and queued["pending_reason"]
    seen_preparing = wait_until(lambda: yard.cluster("auto")["node_counts"]["preparing"] == 2
                                or yard.job("grow")["state"] != "queued", 10,
                                what="scale-up")
    assert seen_preparing
    assert yard.wait_job("grow", timeout=30)["state"] == "succeeded"
    wait_until(lambda: yard.cluster("auto")["current_nodes"] == 0, 20,
               what="scale-down to 0 after the idle timeout")
    assert yard.cluster("auto")["allocation_state"] == "steady"


def test_job_larger_than_max_nodes_is_rejected_at_submit(yard: Yard) -> None:
    res = yard.cli("job", "create", "-f", _sleep_job(yard, "huge", 0.1, nodes=3), "-c", "auto")
    assert res.rc == 2, str(res)
    assert "nodes" in res.stderr and "at most 2" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_cluster_resized_to_zero_queues_jobs_until_it_is_resized(yard: Yard) -> None:
    """Issue 33, item 10: after `cluster resize -t 0` (seed 000's last step) a submit was
    refused ("the job needs 1 nodes but cluster 'parked' has at most 0"). Batch AI queued
    such jobs until the cluster was resized: so does batchyard, saying to resize. A job that
    can never run (more nodes than an autoscale cluster's maximum) is still refused."""
    yard.ok("cluster", "create", "-n", "parked", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("parked", 1)
    yard.ok("cluster", "resize", "-n", "parked", "-t", "0")
    yard.wait_cluster("parked", 0)
    queued = yard.cli("job", "create", "-f", _sleep_job(yard, "waits", 0.1, nodes=2),
                      "-c", "parked")
    assert queued.rc == 0, str(queued)
    reason = wait_until(lambda: (r := yard.job("waits").get("pending_reason") or "")
                        and "resize" in r and r, 20, what="a reason saying to resize")
    assert "batchyard cluster resize -n parked -t 2" in reason, reason
    assert yard.job("waits")["state"] == "queued"
    res = yard.cli("job", "create", "-f", _sleep_job(yard, "never", 0.1, nodes=3), "-c", "auto")
    assert res.rc == 2 and "at most 2" in res.stderr, str(res)  # autoscale max: refused
    yard.ok("cluster", "resize", "-n", "parked", "-t", "2")
    assert yard.wait_job("waits", timeout=60)["state"] == "succeeded"
    yard.ok("cluster", "resize", "-n", "parked", "-t", "0")


@pytest.mark.parametrize("option", ["requeue", "terminate", "waitforjobcompletion"])
def test_resize_down_with_each_deallocation_option(yard: Yard, option: str) -> None:
    cluster = f"shrink-{option}"[:20]
    resp = yard.http.post("/workspaces/default/clusters", json={
        "name": cluster, "vm_size": "Standard_D2_v2",
        "manual": {"target_node_count": 1, "node_deallocation_option": option}})
    assert resp.status_code == 201, resp.text
    job = f"dealloc-{option}"[:30]
    yard.ok("job", "create", "-f", _sleep_job(yard, job, 3), "-c", cluster)
    yard.wait_job(job, ("running",), timeout=20)
    assert yard.cluster(cluster)["node_counts"]["running"] == 1
    yard.ok("cluster", "resize", "-n", cluster, "-t", "0")
    if option == "requeue":
        wait_until(lambda: yard.job(job)["state"] == "queued", 20, what="requeue")
        assert yard.job(job)["attempts"][0]["state"] == "preempted"
        yard.ok("cluster", "resize", "-n", cluster, "-t", "1")
        done = yard.wait_job(job, timeout=30)
        assert done["state"] == "succeeded" and done["attempt"] == 2
        yard.ok("cluster", "resize", "-n", cluster, "-t", "0")
    elif option == "terminate":
        done = yard.wait_job(job, timeout=30)
        assert done["state"] == "failed" and "removed by a resize" in done["message"]
    else:
        assert yard.cluster(cluster)["node_counts"]["leaving"] == 1
        assert yard.wait_job(job, timeout=30)["state"] == "succeeded"
    wait_until(lambda: yard.cluster(cluster)["current_nodes"] == 0, 15, what="node removal")


def test_setup_task_failure_makes_the_node_unusable(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "badsetup", "-s", "Standard_D2_v2", "-t", "1",
            "--setup-task", "echo preparing node $BATCHYARD_NODE_NAME; echo boom >&2; exit 7")
    wait_until(lambda: yard.cluster("badsetup")["node_counts"]["unusable"] == 1, 20,
               what="setup task to fail")
    nodes = yard.js("cluster", "node", "list", "-c", "badsetup")
    assert nodes[0]["state"] == "unusable"
    assert "exit code 7" in nodes[0]["reason"]
    files = yard.js("cluster", "file", "list", "-n", "badsetup")
    assert {f["path"] for f in files} >= {"badsetup-0/setup/stdout.txt",
                                           "badsetup-0/setup/stderr.txt"}
    out = yard.ok("cluster", "file", "show", "-n", "badsetup", "-p",
                  "badsetup-0/setup/stdout.txt").stdout
    assert "preparing node badsetup-0" in out
    yard.ok("job", "create", "-f", _sleep_job(yard, "never-placed", 0.1), "-c", "badsetup")
    time.sleep(1.0)
    job = yard.job("never-placed")
    assert job["state"] == "queued" and "unusable" in job["pending_reason"]
    yard.ok("job", "terminate", "-n", "never-placed")


def test_quota_refuses_a_cluster_and_holds_a_job_back(yard: Yard) -> None:
    res = yard.cli("cluster", "create", "-n", "nc24r", "-s", "Standard_NC24r", "-t", "2")
    assert res.rc == 2, str(res)
    assert "quota" in res.stderr and "standardNCFamily" in res.stderr
    yard.ok("quota", "set", "--family", "standardNCFamily", "--vcpus", "12")
    yard.ok("cluster", "create", "-n", "nc6", "-s", "Standard_NC6", "-t", "2")
    yard.ok("quota", "set", "--family", "standardNCFamily", "--vcpus", "6")
    yard.ok("job", "create", "-f", _sleep_job(yard, "over-quota", 0.1, nodes=2), "-c", "nc6")
    wait_until(lambda: "quota" in (yard.job("over-quota")["pending_reason"] or ""), 10,
               what="a quota pending reason")
    usage = {u["family"]: u for u in yard.js("usage")}
    assert usage["standardNCFamily"]["vcpu_limit"] == 6
    assert usage["standardNCFamily"]["vcpus_allocated"] == 12
    yard.ok("quota", "set", "--family", "standardNCFamily", "--vcpus", "24")
    assert yard.wait_job("over-quota", timeout=20)["state"] == "succeeded"


GATE = """\
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def _gated_job(yard: Yard, name: str, gate: str, nodes: int = 1, **extra: object) -> str:
    """A job that runs until the test opens its gate: ordering tests must not depend on how
    fast a loaded machine runs the CLI."""
    spec = {"name": name, "nodes": nodes, "code": ".", "command": f"python gate.py {gate}",
            **extra}
    return str(yard.write_job(name, spec, {"gate.py": GATE}))


def test_priority_order_and_backfill(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "prio", "-s", "Standard_D2_v2", "-t", "2")
    yard.wait_cluster("prio", 2)
    gate = yard.work / "gate-blocker"
    # blocker holds one node until the gate opens; its wall clock limit bounds it for the
    # scheduler's reservation
    yard.ok("job", "create", "-f", _gated_job(yard, "blocker", str(gate),
                                              limits={"max_wall_clock": 120}), "-c", "prio")
    yard.wait_job("blocker", ("running",), timeout=20)
    # the head of the queue needs both nodes: it must wait for the blocker
    yard.ok("job", "create", "-f", _sleep_job(yard, "wide", 0.2, nodes=2), "-c", "prio")
    # a short job fits on the free node and ends before the blocker's limit: backfilled
    yard.ok("job", "create", "-f", _sleep_job(yard, "short", 0.2,
                                              limits={"max_wall_clock": 30}), "-c", "prio")
    # a job without a limit could delay the head: not backfilled
    yard.ok("job", "create", "-f", _sleep_job(yard, "long", 0.2), "-c", "prio")
    assert yard.wait_job("short", timeout=30)["state"] == "succeeded"
    assert yard.job("wide")["state"] == "queued"
    long_waiting = yard.job("long")
    assert long_waiting["state"] == "queued" and long_waiting["pending_reason"]
    gate.touch()
    wide = yard.wait_job("wide", timeout=30)
    long_ = yard.wait_job("long", timeout=30)
    assert wide["state"] == long_["state"] == "succeeded"
    assert wide["started_at"] <= long_["started_at"], "long must not overtake the head"
    # priorities: while the cluster is busy, a later high-priority job goes before a normal one
    busy_gate = yard.work / "gate-busy"
    yard.ok("job", "create", "-f", _gated_job(yard, "busy", str(busy_gate), nodes=2),
            "-c", "prio")
    yard.wait_job("busy", ("running",), timeout=20)
    yard.ok("job", "create", "-f", _sleep_job(yard, "normal", 0.2, nodes=2), "-c", "prio")
    yard.ok("job", "create", "-f", _sleep_job(yard, "urgent", 0.2, nodes=2,
                                              priority="high"), "-c", "prio")
    busy_gate.touch()
    normal = yard.wait_job("normal", timeout=30)
    urgent = yard.wait_job("urgent", timeout=30)
    assert urgent["started_at"] < normal["started_at"]


def test_preempted_job_checkpoints_requeues_and_resumes(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "lowpri", "-s", "Standard_D2_v2", "-t", "2",
            "--vm-priority", "lowpriority", "--provisioning-delay", "1")
    yard.wait_cluster("lowpri", 2)
    path = yard.write_job("ckpt", {"name": "ckpt", "nodes": 2, "code": ".",
                                   "command": "bash ck.sh",  # it saves at SIGTERM: no notice
                                   "limits": {"checkpoint_notice": 0}}, {"ck.sh": CHECKPOINTER})
    yard.ok("job", "create", "-f", str(path), "-c", "lowpri")
    yard.wait_job("ckpt", ("running",), timeout=20)
    time.sleep(1.5)
    yard.ok("cluster", "node", "preempt", "-c", "lowpri", "-n", "lowpri-1")
    done = yard.wait_job("ckpt", timeout=60)
    assert done["state"] == "succeeded", done
    assert [a["state"] for a in done["attempts"]] == ["preempted", "succeeded"]
    first = yard.ok("job", "logs", "-n", "ckpt", "--attempt", "1").stdout
    second = yard.ok("job", "logs", "-n", "ckpt", "--attempt", "2").stdout
    assert "checkpointed at" in first and "resumes at 0" in first
    resumed = [line for line in second.splitlines() if "resumes at" in line]
    assert len(resumed) == 2, second
    # BATCHYARD_CHECKPOINT_DIR is the node's own (nodes share no disk): the rank whose node
    # survived resumes from its checkpoint; the one moved to the replacement node starts over
    kept = [line for line in resumed if line.startswith("[lowpri-0/")]
    moved = [line for line in resumed if line.startswith("[lowpri-2/")]
    assert kept and all("resumes at 0" not in line for line in kept), second
    assert moved and all("resumes at 0" in line for line in moved), second
    assert second.count("finished at 25") == 2
    files = yard.js("job", "file", "list", "-n", "ckpt", "--attempt", "1")["files"]
    assert any(f["path"].endswith("rank0.stdout.txt") for f in files)
    nodes = {n["name"] for n in yard.js("cluster", "node", "list", "-c", "lowpri")}
    assert "lowpri-1" not in nodes and len(nodes) == 2, "the preempted node is replaced"
