"""The cluster as the database holds it, read at each scrape: jobs by state, queued jobs by
pending-reason class, nodes by state, each node's utilisation (the latest sample its
launcher or agent sent), GPU utilisation of running jobs, log-shipping lag, hung jobs.

Label sets stay bounded: workspace, cluster, node, GPU index, state and reason class; the
only series named after jobs are those of running jobs (a job's series ends with it). A few
grouped queries, and of each node's report only its utilisation sample, so a scrape of 1,000
nodes and 10,000 jobs stays well under 100 ms (bench/metrics_scrape.py)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from batchyard import __version__
from batchyard.server.telemetry.reasons import CLASSES, reason_class
from batchyard.states import ATTEMPT_ACTIVE, JOB_STATES, LAUNCHER_TERMINAL, NODE_STATES
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

STALE = 60.0  # a utilisation sample older than this (its launcher or agent gone) is left out
MB = 1024 * 1024
HUNG = "hung"

NODE = ("workspace", "cluster", "node")
GPU = (*NODE, "gpu")
JOB = ("workspace", "experiment", "job")


def _gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class ClusterCollector(Collector):
    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Any]:
        with self.db.session() as session:
            yield from _collect(session, time.time())


def _collect(session: Session, stamp: float) -> Iterator[Any]:
    info = InfoMetricFamily("batchyard", "The batchyard server.")
    info.add_metric([], {"version": __version__})
    yield info
    workspaces = dict(session.execute(select(Workspace.id, Workspace.name)).all())
    clusters = {cid: (workspaces.get(wid, "?"), name.split("~deleted-")[0])
                for cid, wid, name in session.execute(
                    select(Cluster.id, Cluster.workspace_id, Cluster.name))}
    yield from _jobs(session, clusters)
    nodes = {nid: (*clusters.get(cid, ("?", "?")), name, usage) for nid, cid, name, usage in
             session.execute(select(Node.id, Node.cluster_id, Node.name, Node.usage))}
    yield _node_states(session, clusters)
    yield from _utilisation(session, stamp, nodes, workspaces)


def _jobs(session: Session, clusters: dict[int, tuple[str, str]]) -> Iterator[Any]:
    jobs = _gauge("batchyard_jobs", "Jobs by state.", ("workspace", "cluster", "state"))
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for cid, state, count in session.execute(
            select(Job.cluster_id, Job.state, func.count()).group_by(Job.cluster_id, Job.state)):
        ws, cluster = clusters.get(cid, ("?", "?"))
        counts[(ws, cluster, str(state))] += int(count)
    for ws, cluster in set(clusters.values()):
        for state in JOB_STATES:
            counts.setdefault((ws, cluster, str(state)), 0)
    for key, count in sorted(counts.items()):
        jobs.add_metric(list(key), count)
    yield jobs
    queued = _gauge("batchyard_queued_jobs", "Queued jobs by the class of their pending "
                    "reason.", ("workspace", "cluster", "reason"))
    by_class: dict[tuple[str, str, str], int] = defaultdict(int)
    for cid, reason, count in session.execute(
            select(Job.cluster_id, Job.pending_reason, func.count())
            .where(Job.state == "queued").group_by(Job.cluster_id, Job.pending_reason)):
        ws, cluster = clusters.get(cid, ("?", "?"))
        by_class[(ws, cluster, reason_class(reason))] += int(count)
    for ws, cluster in set(clusters.values()):
        for name in CLASSES:
            by_class.setdefault((ws, cluster, name), 0)
    for key, count in sorted(by_class.items()):
        queued.add_metric(list(key), count)
    yield queued


def _node_states(session: Session, clusters: dict[int, tuple[str, str]]) -> Any:
    family = _gauge("batchyard_nodes", "Nodes by state.", ("workspace", "cluster", "state"))
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for cid, state, count in session.execute(
            select(Node.cluster_id, Node.state, func.count())
            .group_by(Node.cluster_id, Node.state)):
        ws, cluster = clusters.get(cid, ("?", "?"))
        counts[(ws, cluster, str(state))] += int(count)
    for ws, cluster in set(clusters.values()):
        for state in NODE_STATES:
            counts.setdefault((ws, cluster, str(state)), 0)
    for key, count in sorted(counts.items()):
        family.add_metric(list(key), count)
    return family


class _Families:
    def __init__(self) -> None:
        self.cpu = _gauge("batchyard_node_cpu_utilization_percent",
                          "CPU utilisation of a node's machine.", NODE)
        self.mem = _gauge("batchyard_node_memory_used_bytes",
                          "Memory in use on a node's machine.", NODE)
        self.mem_total = _gauge("batchyard_node_memory_total_bytes",
                                "Memory of a node's machine.", NODE)
        self.gpu = _gauge("batchyard_node_gpu_utilization_percent",
                          "Utilisation of each GPU of a node.", GPU)
        self.gpu_mem = _gauge("batchyard_node_gpu_memory_used_bytes",
                              "Memory in use on each GPU of a node.", GPU)
        self.gpu_mem_total = _gauge("batchyard_node_gpu_memory_total_bytes",
                                    "Memory of each GPU of a node.", GPU)
        self.job_gpu = _gauge("batchyard_job_gpu_utilization_percent",
                              "Utilisation of each GPU a running job holds.", (*JOB, "node", "gpu"))
        self.job_gpu_mem = _gauge("batchyard_job_gpu_memory_used_bytes",
                                  "Memory in use on each GPU a running job holds.",
                                  (*JOB, "node", "gpu"))
        self.lag = _gauge("batchyard_log_shipping_lag_seconds",
                          "How long the oldest log line a node has not yet shipped to the "
                          "server has waited (0: all shipped).", NODE)
        self.hung = _gauge("batchyard_job_hung", "1 for a running job whose current attempt "
                           "the hang watchdog found hung.", JOB)

    def all(self) -> list[GaugeMetricFamily]:
        return [self.cpu, self.mem, self.mem_total, self.gpu, self.gpu_mem,
                self.gpu_mem_total, self.job_gpu, self.job_gpu_mem, self.lag, self.hung]


def _sample(families: _Families, where: list[str], util: dict[str, Any],
            job: list[str] | None) -> None:
    for family, key in ((families.cpu, "cpu_percent"), (families.mem, "mem_used_bytes"),
                        (families.mem_total, "mem_total_bytes")):
        value = _number(util.get(key))
        if value is not None:
            family.add_metric(where, value)
    for gpu in util.get("gpus") or []:
        if not isinstance(gpu, dict) or _number(gpu.get("index")) is None:
            continue
        labels = [*where, str(int(gpu["index"]))]
        used, total = _number(gpu.get("mem_used_mb")), _number(gpu.get("mem_total_mb"))
        busy = _number(gpu.get("util_percent"))
        if busy is not None:
            families.gpu.add_metric(labels, busy)
        if used is not None:
            families.gpu_mem.add_metric(labels, used * MB)
        if total is not None:
            families.gpu_mem_total.add_metric(labels, total * MB)
        if job is not None:
            if busy is not None:
                families.job_gpu.add_metric([*job, *labels[2:]], busy)
            if used is not None:
                families.job_gpu_mem.add_metric([*job, *labels[2:]], used * MB)


def _utilisation(session: Session, stamp: float,
                 nodes: dict[int, tuple[str, str, str, Any]],
                 workspaces: dict[int, str]) -> Iterator[Any]:
    families = _Families()
    rows = session.execute(
        select(NodeReport.node_id, Attempt.job_id, Attempt.started_at, NodeReport.data["util"],
               NodeReport.data["log_lag"])
        .join(Attempt, Attempt.id == NodeReport.attempt_id)
        .where(Attempt.state.in_(ATTEMPT_ACTIVE),
               NodeReport.state.not_in(LAUNCHER_TERMINAL))).all()
    job_ids = {job_id for _, job_id, *_ in rows}
    names = _job_names(session, job_ids, workspaces)
    sampled: set[int] = set()
    for node_id, job_id, _started, util, lag in rows:
        node = nodes.get(node_id) if node_id is not None else None
        if node is None:
            continue
        where = list(node[:3])
        lag_value = _number(lag)
        if lag_value is not None:
            families.lag.add_metric(where, lag_value)
        if not isinstance(util, dict) or stamp - (_number(util.get("ts")) or 0.0) > STALE:
            continue
        sampled.add(node_id)
        _sample(families, where, util, names.get(job_id))
    for node_id, (ws, cluster, name, usage) in nodes.items():
        if node_id in sampled or not isinstance(usage, dict):
            continue  # (an agent's own sample when no launcher's is fresher)
        if stamp - (_number(usage.get("ts")) or 0.0) <= STALE:
            _sample(families, [ws, cluster, name], usage, None)
    started = {job_id: at for _, job_id, at, *_ in rows}
    for job_id, at in _hung_since(session, job_ids).items():
        if job_id in names and at >= (started.get(job_id) or 0.0):
            families.hung.add_metric(names[job_id], 1)
    yield from families.all()


def _job_names(session: Session, job_ids: set[int],
               workspaces: dict[int, str]) -> dict[int, list[str]]:
    if not job_ids:
        return {}
    rows = session.execute(select(Job.id, Job.workspace_id, Experiment.name, Job.name)
                           .join(Experiment, Experiment.id == Job.experiment_id)
                           .where(Job.id.in_(job_ids)))
    return {jid: [workspaces.get(wid, "?"), exp, name] for jid, wid, exp, name in rows}


def _hung_since(session: Session, job_ids: set[int]) -> dict[int, float]:
    if not job_ids:
        return {}
    return {int(jid): float(ts) for jid, ts in session.execute(
        select(Event.entity_id, func.max(Event.ts))
        .where(Event.kind == "job", Event.to_state == HUNG, Event.entity_id.in_(job_ids))
        .group_by(Event.entity_id))}
