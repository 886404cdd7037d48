"""What nodes and running jobs use, from the latest sample each node's launcher (or, on an
idle machine, its agent) sent: a node's CPU and memory utilisation, GPU utilisation (the mean
of its GPUs) and GPU memory in use (their sum), a running job's GPU utilisation (the mean of
every GPU it holds), how far a node's log shipping lags (when it does), and hung jobs.

One series per node and per running job: prometheus-client renders each sample at a cost
(~10 us on this project's machines), and a scrape of 1,000 nodes must stay under 100 ms.
``BATCHYARD_METRICS_DETAIL=1`` adds memory in bytes and capacities per node and a series per
GPU (``gpu`` label) for sites that want DCGM-like detail: a scrape then grows with the GPU
count. Of each report only the utilisation sample is read from the database."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from batchyard.states import ATTEMPT_ACTIVE, LAUNCHER_TERMINAL
from batchyard.store.models import Attempt, Event, Experiment, Job, Node, NodeReport

STALE = 60.0  # a sample older than this (its launcher or agent gone) is left out
MB = 1024 * 1024
HUNG = "hung"
NODE = ("workspace", "cluster", "node")
JOB = ("workspace", "experiment", "job")
DETAIL_ENV = "BATCHYARD_METRICS_DETAIL"


def gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class _Families:
    def __init__(self, detail: bool) -> None:
        self.cpu = gauge("batchyard_node_cpu_utilization_percent",
                         "CPU utilisation of a node's machine.", NODE)
        self.mem = gauge("batchyard_node_memory_utilization_percent",
                         "Memory in use on a node's machine, in percent of it.", NODE)
        self.gpu = gauge("batchyard_node_gpu_utilization_percent",
                         "GPU utilisation of a node: the mean of its GPUs.", NODE)
        self.gpu_mem = gauge("batchyard_node_gpu_memory_used_bytes",
                             "GPU memory in use on a node, all its GPUs together.", NODE)
        self.job_gpu = gauge("batchyard_job_gpu_utilization_percent",
                             "GPU utilisation of a running job: the mean of the GPUs it "
                             "holds.", JOB)
        self.lag = gauge("batchyard_log_shipping_lag_seconds",
                         "How long the oldest log line a node has not yet shipped to the "
                         "server has waited (none: all shipped).", NODE)
        self.hung = gauge("batchyard_job_hung", "1 for a running job whose current attempt "
                          "the hang watchdog found hung.", JOB)
        self.detail: list[GaugeMetricFamily] = []
        if detail:
            self.detail = [
                gauge("batchyard_node_memory_used_bytes", "Memory in use on a node's machine.",
                      NODE),
                gauge("batchyard_node_memory_total_bytes", "Memory of a node's machine.", NODE),
                gauge("batchyard_node_gpu_memory_total_bytes",
                      "GPU memory of a node, all its GPUs together.", NODE),
                gauge("batchyard_gpu_utilization_percent", "Utilisation of each GPU of a node.",
                      (*NODE, "gpu")),
                gauge("batchyard_gpu_memory_used_bytes", "Memory in use on each GPU of a node.",
                      (*NODE, "gpu"))]
        self.jobs: dict[tuple[str, ...], list[float]] = {}  # GPU-weighted sums, GPUs

    def all(self) -> Iterator[GaugeMetricFamily]:
        for labels, (weighted, count) in self.jobs.items():
            self.job_gpu.add_metric(list(labels), weighted / count)
        yield from (self.cpu, self.mem, self.gpu, self.gpu_mem, self.job_gpu, self.lag,
                    self.hung, *self.detail)

    def sample(self, where: list[str], brief: dict[str, Any], job: list[str] | None) -> None:
        """A node's summary (node/usage.py ``summary``): the series of every scrape."""
        for family, key in ((self.cpu, "cpu"), (self.mem, "mem"), (self.gpu_mem, "gpu_mem")):
            value = number(brief.get(key))
            if value is not None:
                family.add_metric(where, value)
        lag = number(brief.get("lag"))
        if lag:  # (a node that keeps up has no series)
            self.lag.add_metric(where, lag)
        gpu, count = number(brief.get("gpu")), number(brief.get("gpus"))
        if gpu is None:
            return
        self.gpu.add_metric(where, gpu)
        if job is not None and count:
            weighted, seen = self.jobs.get(tuple(job), [0.0, 0.0])
            self.jobs[tuple(job)] = [weighted + gpu * count, seen + count]

    def details(self, where: list[str], util: dict[str, Any]) -> None:
        """``BATCHYARD_METRICS_DETAIL``: bytes, capacities and each GPU, from the sample."""
        used, total = number(util.get("mem_used_bytes")), number(util.get("mem_total_bytes"))
        if used is not None and total is not None:
            self.detail[0].add_metric(where, used)
            self.detail[1].add_metric(where, total)
        gpu_total = 0.0
        for gpu in util.get("gpus") or ():
            try:
                percent, mem = float(gpu["util_percent"]), float(gpu.get("mem_used_mb") or 0)
                gpu_total += float(gpu.get("mem_total_mb") or 0.0)
            except (TypeError, ValueError, KeyError, AttributeError):
                continue
            labels = [*where, str(gpu.get("index"))]
            self.detail[3].add_metric(labels, percent)
            self.detail[4].add_metric(labels, mem * MB)
        if gpu_total:
            self.detail[2].add_metric(where, gpu_total * MB)


def _fresh(brief: Any, stamp: float) -> bool:
    return isinstance(brief, dict) and stamp - (number(brief.get("ts")) or 0.0) <= STALE


def utilisation(session: Session, stamp: float, nodes: dict[int, tuple[str, str, str]],
                workspaces: dict[int, str]) -> Iterator[Any]:
    families = _Families(os.environ.get(DETAIL_ENV, "") not in ("", "0"))
    detail = bool(families.detail)
    columns = [NodeReport.node_id, Attempt.job_id, Attempt.started_at,
               NodeReport.data["scrape"]]
    if detail:
        columns.append(NodeReport.data["util"])
    rows = session.execute(
        select(*columns).join(Attempt, Attempt.id == NodeReport.attempt_id)
        .where(Attempt.state.in_(ATTEMPT_ACTIVE),
               NodeReport.state.not_in(LAUNCHER_TERMINAL))).all()
    job_ids = {row[1] for row in rows}
    names = _job_names(session, job_ids, workspaces)
    sampled: set[int] = set()
    for node_id, job_id, _started, brief, *util in rows:
        node = nodes.get(node_id) if node_id is not None else None
        if node is None or not _fresh(brief, stamp):
            continue
        sampled.add(node_id)
        families.sample(list(node), brief, names.get(job_id))
        if detail and isinstance(util[0], dict):
            families.details(list(node), util[0])
    unsampled = [n for n in nodes if n not in sampled]
    for start in range(0, len(unsampled), 1000):  # an agent's sample of an idle machine
        chunk = unsampled[start:start + 1000]
        query = select(Node.id, Node.usage["scrape"], *([Node.usage] if detail else []))
        for node_id, brief, *usage in session.execute(
                query.where(Node.id.in_(chunk), Node.usage.is_not(None))):
            if _fresh(brief, stamp):
                families.sample(list(nodes[node_id]), brief, None)
                if detail and isinstance(usage[0], dict):
                    families.details(list(nodes[node_id]), usage[0])
    started = {row[1]: row[2] for row in rows}
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
