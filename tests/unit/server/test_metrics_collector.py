"""What /metrics reads from the database (server/telemetry/collector.py), on a real SQLite
store through prometheus-client's own exposition and parser: jobs by state and cluster,
queued jobs by reason class, nodes by state, per-node and per-job GPU series from the
launchers' and agents' samples (stale ones left out), log lag, hung jobs; and the bounded
label sets (job names only on running jobs' series)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchyard.node.usage import summary
from batchyard.server.services.gpu_usage import machine_sample
from batchyard.server.telemetry.channel_errors import call_of
from batchyard.server.telemetry.collector import ClusterCollector
from batchyard.server.telemetry.reasons import CLASSES, reason_class
from batchyard.store.db import Database
from batchyard.store.models import (
    Attempt,
    Cluster,
    Event,
    Experiment,
    Job,
    Node,
    NodeReport,
    Workspace,
)

REASONS = {
    "waiting for the scheduler": "scheduler",
    "waiting for 2 idle nodes: 1 idle, 1 provisioning": "nodes",
    "waiting for nodes to return after preemption": "nodes",
    "quota: standardNCFamily 24/24 vCPUs in use in workspace 3 (needs 12 more)": "quota",
    "waiting for job prep to succeed (it is running)": "dependency",
    "array sim: at most 8 of its jobs run at once (8 running now)": "array_limit",
    "waiting behind job 7 (higher priority), expected to start in about 5 min":
        "behind_other_job",
    "needs 3 nodes but cluster 'c' has only 2; it cannot start until the cluster is "
    "enlarged": "cannot_fit",
    "Slurm job 42 pending: Resources (the nodes it needs are busy)": "external_queue",
    "waiting to retry": "retry",
    "something new": "other",
    None: "scheduler",
}


@pytest.mark.parametrize(("reason", "expected"), list(REASONS.items()))
def test_reason_classes(reason: str | None, expected: str) -> None:
    assert reason_class(reason) == expected and expected in CLASSES


def test_channel_calls_are_named_without_ids() -> None:
    assert call_of("/api/v1/node/attempts/6f1c/nodes/3/logs") == "logs"
    assert call_of("/api/v1/node/attempts/6f1c/nodes/0/sessions/w1.x/out") == "exec"
    assert call_of("/api/v1/agent/nodes/box-1/heartbeat") == "heartbeat"
    assert call_of("/api/v1/agent/join") == "join"


def _util(cpu: float, gpus: list[tuple[int, float]], age: float = 0.0) -> dict[str, Any]:
    return {"ts": time.time() - age, "cpu_percent": cpu, "mem_used_bytes": 2 << 30,
            "mem_total_bytes": 8 << 30, "mem_percent": 25.0,
            "gpus": [{"index": i, "util_percent": u, "mem_used_mb": 100, "mem_total_mb": 1000}
                     for i, u in gpus]}


def _report(util: dict[str, Any], lag: float = 0.0) -> dict[str, Any]:
    """A launcher's report as it stores its sample: whole, and summed up for /metrics."""
    return {"util": util, "scrape": {**summary(util), "lag": lag}}


@pytest.fixture
def db(tmp_path: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.migrate()
    with db.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        exp = Experiment(workspace_id=ws.id, name="e")
        c = Cluster(workspace_id=ws.id, name="gpu", backend="local", spec={}, size={})
        s.add_all([exp, c])
        s.flush()
        nodes = [Node(cluster_id=c.id, name=f"gpu-{i}", index=i, address="127.0.0.1",
                      state=state, resources={}, directory="/x")
                 for i, state in enumerate(("running", "running", "idle", "lost"))]
        s.add_all(nodes)
        s.flush()
        nodes[2].usage = machine_sample(_util(5.0, [(0, 1.0)]))  # an agent's, of an idle machine
        jobs = {}
        for name, state, reason in (("train", "running", None), ("q1", "queued", "waiting for "
                                    "2 idle nodes: 0 idle"), ("q2", "queued", "quota: x"),
                                    ("done", "succeeded", None), ("old", "running", None)):
            job = Job(workspace_id=ws.id, experiment_id=exp.id, cluster_id=c.id, name=name,
                      spec={}, state=state, pending_reason=reason, directory="/x")
            s.add(job)
            jobs[name] = job
        s.flush()
        attempt = Attempt(job_id=jobs["train"].id, number=1, uuid="a1", state="running",
                          node_ids=[nodes[0].id], directory="/x/a1", started_at=time.time() - 60)
        stale = Attempt(job_id=jobs["old"].id, number=1, uuid="a2", state="running",
                        node_ids=[nodes[1].id], directory="/x/a2", started_at=time.time() - 60)
        s.add_all([attempt, stale])
        s.flush()
        s.add(NodeReport(attempt_id=attempt.id, node_rank=0, node_id=nodes[0].id,
                         token_hash="t", seq=3, state="running",
                         data=_report(_util(55.0, [(0, 97.0), (1, 3.0)]), lag=1.5)))
        s.add(NodeReport(attempt_id=stale.id, node_rank=0, node_id=nodes[1].id,
                         token_hash="u", seq=3, state="running",
                         data=_report(_util(9.0, [(2, 50.0)], age=3600))))
        s.add(Event(kind="job", entity_id=jobs["train"].id, from_state="running",
                    to_state="hung", message="hung", ts=time.time()))
    return db


def _scrape(db: Database) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(ClusterCollector(db))
    text = generate_latest(registry).decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _value(found: dict[str, Any], name: str, **labels: str) -> float | None:
    for have, value in found.get(name, []):
        if all(have.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


def test_counts_by_state_and_reason(db: Database) -> None:
    found = _scrape(db)
    assert _value(found, "batchyard_jobs", cluster="gpu", state="running") == 2
    assert _value(found, "batchyard_jobs", cluster="gpu", state="queued") == 2
    assert _value(found, "batchyard_jobs", cluster="gpu", state="failed") == 0  # a stable set
    assert _value(found, "batchyard_queued_jobs", reason="nodes") == 1
    assert _value(found, "batchyard_queued_jobs", reason="quota") == 1
    assert _value(found, "batchyard_queued_jobs", reason="dependency") == 0
    assert _value(found, "batchyard_nodes", state="running") == 2
    assert _value(found, "batchyard_nodes", state="lost") == 1
    assert _value(found, "batchyard_nodes", state="unusable") == 0


def test_utilisation_of_nodes_and_running_jobs(db: Database) -> None:
    found = _scrape(db)
    assert _value(found, "batchyard_node_cpu_utilization_percent", node="gpu-0") == 55.0
    assert _value(found, "batchyard_node_memory_utilization_percent", node="gpu-0") == 25.0
    assert _value(found, "batchyard_node_gpu_utilization_percent", node="gpu-0") == 50.0
    assert _value(found, "batchyard_node_gpu_memory_used_bytes",
                  node="gpu-0") == 200 * 1024 * 1024
    assert _value(found, "batchyard_job_gpu_utilization_percent", job="train", experiment="e",
                  workspace="default") == 50.0
    assert _value(found, "batchyard_log_shipping_lag_seconds", node="gpu-0") == 1.5
    assert _value(found, "batchyard_log_shipping_lag_seconds", node="gpu-2") is None  # 0
    # an idle machine's agent sample; a launcher's stale sample is left out
    assert _value(found, "batchyard_node_cpu_utilization_percent", node="gpu-2") == 5.0
    assert _value(found, "batchyard_node_cpu_utilization_percent", node="gpu-1") is None
    assert _value(found, "batchyard_job_gpu_utilization_percent", job="old") is None
    assert _value(found, "batchyard_job_hung", job="train") == 1
    assert _value(found, "batchyard_job_hung", job="old") is None
    for detail in ("batchyard_gpu_utilization_percent", "batchyard_node_memory_total_bytes"):
        assert detail not in found  # only when asked


def test_detail_when_asked(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHYARD_METRICS_DETAIL", "1")
    found = _scrape(db)
    assert _value(found, "batchyard_gpu_utilization_percent", node="gpu-0", gpu="0") == 97.0
    assert _value(found, "batchyard_gpu_utilization_percent", node="gpu-0", gpu="1") == 3.0
    assert _value(found, "batchyard_gpu_memory_used_bytes", node="gpu-2",
                  gpu="0") == 100 * 1024 * 1024
    assert _value(found, "batchyard_node_memory_total_bytes", node="gpu-0") == 8 << 30
    assert _value(found, "batchyard_node_memory_used_bytes", node="gpu-0") == 2 << 30
    assert _value(found, "batchyard_node_gpu_memory_total_bytes",
                  node="gpu-0") == 2000 * 1024 * 1024


def test_label_sets_are_bounded(db: Database) -> None:
    found = _scrape(db)
    jobs_seen = {labels.get("job") for samples in found.values() for labels, _ in samples}
    assert jobs_seen <= {None, "train"}  # only running jobs' series name a job
    allowed = {"workspace", "cluster", "state", "reason", "node", "experiment", "job",
               "version"}
    assert {k for samples in found.values() for labels, _ in samples for k in labels} <= allowed
