"""What nodes and running jobs use, from the latest sample each node's launcher (or, on an
idle machine, its agent) sent: a node's CPU, memory, GPU utilisation (the mean of its GPUs)
and GPU memory (their sum), a running job's GPU utilisation (the mean of every GPU it holds),
how far each node's log shipping lags, and hung jobs. One series per node and per running
job; ``BATCHYARD_METRICS_GPU_DEVICES=1`` adds one per GPU (``gpu`` label) for sites that want
DCGM-like detail (a scrape then grows with the GPU count). Of each report only the
utilisation sample is read from the database."""

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
DEVICES_ENV = "BATCHYARD_METRICS_GPU_DEVICES"


def gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class _Families:
    def __init__(self, devices: bool) -> None:
        self.cpu = gauge("batchyard_node_cpu_utilization_percent",
                         "CPU utilisation of a node's machine.", NODE)
        self.mem = gauge("batchyard_node_memory_used_bytes",
                         "Memory in use on a node's machine.", NODE)
        self.mem_total = gauge("batchyard_node_memory_total_bytes",
                               "Memory of a node's machine.", NODE)
        self.gpu = gauge("batchyard_node_gpu_utilization_percent",
                         "GPU utilisation of a node: the mean of its GPUs.", NODE)
        self.gpu_mem = gauge("batchyard_node_gpu_memory_used_bytes",
                             "GPU memory in use on a node, all its GPUs together.", NODE)
        self.gpu_mem_total = gauge("batchyard_node_gpu_memory_total_bytes",
                                   "GPU memory of a node, all its GPUs together.", NODE)
        self.job_gpu = gauge("batchyard_job_gpu_utilization_percent",
                             "GPU utilisation of a running job: the mean of the GPUs it "
                             "holds.", JOB)
        self.lag = gauge("batchyard_log_shipping_lag_seconds",
                         "How long the oldest log line a node has not yet shipped to the "
                         "server has waited (0: all shipped).", NODE)
        self.hung = gauge("batchyard_job_hung", "1 for a running job whose current attempt "
                          "the hang watchdog found hung.", JOB)
        self.device: GaugeMetricFamily | None = None
        self.device_mem: GaugeMetricFamily | None = None
        if devices:
            self.device = gauge("batchyard_gpu_utilization_percent",
                                "Utilisation of each GPU of a node.", (*NODE, "gpu"))
            self.device_mem = gauge("batchyard_gpu_memory_used_bytes",
                                    "Memory in use on each GPU of a node.", (*NODE, "gpu"))
        self.jobs: dict[tuple[str, ...], list[float]] = {}  # a job's GPU readings

    def all(self) -> Iterator[GaugeMetricFamily]:
        for labels, readings in self.jobs.items():
            self.job_gpu.add_metric(list(labels), sum(readings) / len(readings))
        yield from (self.cpu, self.mem, self.mem_total, self.gpu, self.gpu_mem,
                    self.gpu_mem_total, self.job_gpu, self.lag, self.hung)
        if self.device is not None and self.device_mem is not None:
            yield from (self.device, self.device_mem)

    def sample(self, where: list[str], util: dict[str, Any], job: list[str] | None) -> None:
        for family, key in ((self.cpu, "cpu_percent"), (self.mem, "mem_used_bytes"),
                            (self.mem_total, "mem_total_bytes")):
            value = number(util.get(key))
            if value is not None:
                family.add_metric(where, value)
        lag = number(util.get("log_lag"))
        if lag:  # (a node that keeps up has no series)
            self.lag.add_metric(where, lag)
        busy: list[float] = []
        used = total = 0.0
        devices = self.device is not None
        for gpu in util.get("gpus") or ():
            try:
                percent = float(gpu["util_percent"])
                mem = float(gpu.get("mem_used_mb") or 0.0)
                total += float(gpu.get("mem_total_mb") or 0.0)
            except (TypeError, ValueError, KeyError, AttributeError):
                continue
            busy.append(percent)
            used += mem
            if devices and self.device is not None and self.device_mem is not None:
                labels = [*where, str(gpu.get("index"))]
                self.device.add_metric(labels, percent)
                self.device_mem.add_metric(labels, mem * MB)
        if not busy:
            return
        self.gpu.add_metric(where, sum(busy) / len(busy))
        self.gpu_mem.add_metric(where, used * MB)
        self.gpu_mem_total.add_metric(where, total * MB)
        if job is not None:
            self.jobs.setdefault(tuple(job), []).extend(busy)


def utilisation(session: Session, stamp: float, nodes: dict[int, tuple[str, str, str]],
                workspaces: dict[int, str]) -> Iterator[Any]:
    families = _Families(os.environ.get(DEVICES_ENV, "") not in ("", "0"))
    rows = session.execute(
        select(NodeReport.node_id, Attempt.job_id, Attempt.started_at, NodeReport.data["util"])
        .join(Attempt, Attempt.id == NodeReport.attempt_id)
        .where(Attempt.state.in_(ATTEMPT_ACTIVE),
               NodeReport.state.not_in(LAUNCHER_TERMINAL))).all()
    job_ids = {job_id for _, job_id, *_ in rows}
    names = _job_names(session, job_ids, workspaces)
    sampled: set[int] = set()
    for node_id, job_id, _started, util in rows:
        node = nodes.get(node_id) if node_id is not None else None
        if node is None or not isinstance(util, dict) or \
                stamp - (number(util.get("ts")) or 0.0) > STALE:
            continue
        sampled.add(node_id)
        families.sample(list(node), util, names.get(job_id))
    unsampled = [n for n in nodes if n not in sampled]
    for start in range(0, len(unsampled), 1000):  # an agent's sample of an idle machine
        chunk = unsampled[start:start + 1000]
        for node_id, usage in session.execute(select(Node.id, Node.usage)
                                              .where(Node.id.in_(chunk),
                                                     Node.usage.is_not(None))):
            if isinstance(usage, dict) and stamp - (number(usage.get("ts")) or 0.0) <= STALE:
                families.sample(list(nodes[node_id]), usage, None)
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
