"""GPU utilisation per job, from what each node launcher reports (``gpu`` in its status:
node/gpu_usage.py): the mean and 10th percentile per GPU (``job show``), the series the
portal charts, and the job's event when all its GPUs have stayed idle for the window
(``GPUs idle: 3 % over 15 min``). The thresholds are the server's settings:
``BATCHYARD_GPU_IDLE_PERCENT`` (10), ``BATCHYARD_GPU_IDLE_MINUTES`` (15) and how often GPUs
are read, ``BATCHYARD_GPU_SAMPLE_SECONDS`` (5); they reach the launchers in their plans."""

from __future__ import annotations

import logging
import os
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.scheduler.reasons import duration
from batchyard.server.services import common
from batchyard.store.models import Attempt, Job, Node, NodeReport

log = logging.getLogger(__name__)
IDLE_EVENT = "gpus-idle"
DEFAULTS = {"BATCHYARD_GPU_SAMPLE_SECONDS": 5.0, "BATCHYARD_GPU_IDLE_PERCENT": 10.0,
            "BATCHYARD_GPU_IDLE_MINUTES": 15.0, "BATCHYARD_EVENT_SYNC_SECONDS": 30.0}


def _setting(name: str) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return DEFAULTS[name]
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0 or (name.endswith("_SECONDS") and value < 0.2):
        log.warning("%s=%r is not a usable number; using %g", name, raw, DEFAULTS[name])
        return DEFAULTS[name]
    return value


def observe_settings() -> dict[str, float]:
    """What a node plan's ``observe`` holds: how often the launcher reads GPUs, when it calls
    them idle, how often it sends a running job's TensorBoard files (node/event_sync.py)."""
    return {"interval": _setting("BATCHYARD_GPU_SAMPLE_SECONDS"),
            "idle_percent": _setting("BATCHYARD_GPU_IDLE_PERCENT"),
            "idle_seconds": 60.0 * _setting("BATCHYARD_GPU_IDLE_MINUTES"),
            "event_sync": _setting("BATCHYARD_EVENT_SYNC_SECONDS")}


def idle_message(mean: float, window: float) -> str:
    return f"GPUs idle: {mean:.0f} % over {duration(window)}"


def note_report(session: Session, attempt: Attempt, row: NodeReport,
                before: dict[str, Any] | None, status: dict[str, Any]) -> None:
    """Called as a launcher's report is applied: when it starts an idle spell of its GPUs
    and every other node of the gang holding GPUs is idle too, the job gets the event (once
    per spell: a spell is known by when it began)."""
    idle = _idle(status) if status.get("gpu") else None
    if idle is None or (_idle(before) or {}).get("since") == idle.get("since"):
        return
    spells = [idle]
    for other in session.scalars(select(NodeReport).where(NodeReport.attempt_id == attempt.id,
                                                          NodeReport.id != row.id)):
        if not _holds_gpus(session, other):
            continue
        found = _idle(other.data)
        if found is None:
            return  # a node whose GPUs work: the job is not idle
        spells.append(found)
    weights = [max(1, len(s["_gpus"])) for s in spells]
    mean = sum(float(s.get("mean") or 0.0) * w for s, w in zip(spells, weights, strict=True)) \
        / max(1, sum(weights))
    window = float(idle.get("window") or 0.0)
    job = session.get(Job, attempt.job_id)
    if job is not None:
        common.record(session, "job", job.id, job.state, IDLE_EVENT, idle_message(mean, window))


def node_view(report: dict[str, Any]) -> dict[str, Any]:
    """What a node's view in ``job show`` adds: its GPUs' record, when it has GPUs."""
    gpu = report.get("gpu")
    gpus = gpu.get("gpus") if isinstance(gpu, dict) else None
    return {"gpus": gpus} if gpus else {}


def _holds_gpus(session: Session, row: NodeReport) -> bool:
    """Whether the node of a report holds GPUs: its node's GPUs, or (a node gone) what its
    launcher reported."""
    node = session.get(Node, row.node_id) if row.node_id is not None else None
    if node is not None:
        return bool((node.resources or {}).get("gpu_ids"))
    return bool(((row.data or {}).get("gpu") or {}).get("gpus"))


def _idle(data: dict[str, Any] | None) -> dict[str, Any] | None:
    gpu = (data or {}).get("gpu")
    if not isinstance(gpu, dict) or not isinstance(gpu.get("idle"), dict):
        return None
    return {**gpu["idle"], "_gpus": list((gpu.get("gpus") or {}).keys())}


def _attempts_with_gpus(session: Session, job: Job) -> tuple[Attempt | None, list[NodeReport]]:
    attempts = session.scalars(select(Attempt).where(Attempt.job_id == job.id)
                               .order_by(Attempt.number.desc()))
    for attempt in attempts:
        rows = [r for r in session.scalars(select(NodeReport).where(
            NodeReport.attempt_id == attempt.id).order_by(NodeReport.node_rank))
            if ((r.data or {}).get("gpu") or {}).get("gpus")]
        if rows:
            return attempt, rows
    return None, []


def _node_name(session: Session, row: NodeReport) -> str:
    name = (row.data or {}).get("node")
    if not name and row.node_id is not None:
        node = session.get(Node, row.node_id)
        name = node.name if node is not None else None
    return str(name or f"node {row.node_rank}")


def from_attempts(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per GPU of the latest attempt that had GPUs (``job show``'s attempts, their node
    views): mean and p10 utilisation, samples, most memory used."""
    for attempt in reversed(attempts):
        out = []
        for node in attempt.get("nodes") or []:
            for index, summary in sorted((node.get("gpus") or {}).items(),
                                         key=lambda kv: (len(kv[0]), kv[0])):
                if isinstance(summary, dict):
                    out.append({"attempt": attempt.get("number"), "node": node.get("node"),
                                "gpu": int(index) if str(index).isdigit() else index,
                                "mean": summary.get("mean"), "p10": summary.get("p10"),
                                "samples": summary.get("samples"),
                                "memory_max_mb": summary.get("mem_max_mb"),
                                "memory_total_mb": summary.get("mem_total_mb")})
        if out:
            return out
    return []


def job_series(session: Session, job: Job) -> list[dict[str, Any]]:
    """The portal's chart: one series per GPU, x in minutes since the job's first sample."""
    _attempt, rows = _attempts_with_gpus(session, job)
    series = []
    for row in rows:
        block = ((row.data or {})["gpu"] or {}).get("series") or {}
        step = float(block.get("step") or 0.0)
        for index, values in sorted((block.get("gpus") or {}).items()):
            points = [[round((i + 0.5) * step / 60.0, 2), v] for i, v in enumerate(values or [])
                      if isinstance(v, int | float)]
            series.append({"name": f"{_node_name(session, row)} GPU {index}",
                           "points": points})
    return series


_SAMPLE_KEYS = ("ts", "cpu_percent", "mem_used_bytes", "mem_total_bytes", "mem_percent")
_GPU_KEYS = ("index", "util_percent", "mem_used_mb", "mem_total_mb")
MAX_GPUS = 64


def _numbers(raw: dict[str, Any], keys: tuple[str, ...]) -> dict[str, float]:
    return {k: raw[k] for k in keys if isinstance(raw.get(k), int | float)
            and not isinstance(raw.get(k), bool)}


def machine_sample(raw: Any) -> dict[str, Any] | None:
    """An agent's utilisation sample as kept on its node: numbers only, at most MAX_GPUS."""
    if not isinstance(raw, dict) or not isinstance(raw.get("ts"), int | float):
        return None
    sample: dict[str, Any] = _numbers(raw, _SAMPLE_KEYS)
    gpus: list[Any] = raw["gpus"] if isinstance(raw.get("gpus"), list) else []
    sample["gpus"] = [_numbers(g, _GPU_KEYS) for g in gpus[:MAX_GPUS] if isinstance(g, dict)]
    from batchyard.node.usage import summary

    sample["scrape"] = summary(sample)  # what /metrics reads, as of a launcher's report
    return sample
