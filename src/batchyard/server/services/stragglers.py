"""Stragglers named (issue 36 §5): from the step numbers and times of the metrics the ranks
log (``batchyard.log_metric(..., step=N)``), each rank's seconds per step over a recent
window; a rank slower than the median of the gang's other ranks by the factor is named on the
attempt (``job show``, the portal) and in the job's events, with its node.

Cheap by construction: looked at when a batch of metrics with steps arrives, at most once per
``gap`` seconds per job, by one aggregate query over that job's recent metrics (indexed by
job); nothing runs for jobs that log no steps. The window and factor come from the server's
environment (BATCHYARD_STRAGGLER_WINDOW, seconds, default 300; BATCHYARD_STRAGGLER_FACTOR,
default 1.5): a cluster of slow jobs may want a longer window, and tests a short one."""

from __future__ import annotations

import os
import statistics
import threading
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from batchyard.server.services import common
from batchyard.store.models import Attempt, Job, Metric, Node, now

DEFAULT_WINDOW = 300.0
DEFAULT_FACTOR = 1.5
MIN_STEPS = 3  # a rank's rate needs this many distinct steps in the window

_lock = threading.Lock()
_looked: dict[int, float] = {}  # job id -> when its ranks were last compared


def settings() -> tuple[float, float]:
    def number(name: str, default: float) -> float:
        try:
            value = float(os.environ.get(name) or default)
        except ValueError:
            return default
        return value if value > 0 else default

    return (number("BATCHYARD_STRAGGLER_WINDOW", DEFAULT_WINDOW),
            number("BATCHYARD_STRAGGLER_FACTOR", DEFAULT_FACTOR))


def _due(job_id: int, stamp: float, gap: float) -> bool:
    with _lock:
        if stamp - _looked.get(job_id, 0.0) < gap:
            return False
        _looked[job_id] = stamp
        if len(_looked) > 10_000:  # ended jobs: forget the oldest
            for old in sorted(_looked, key=_looked.__getitem__)[:5_000]:
                del _looked[old]
        return True


def rates(session: Session, job: Job, since: float) -> dict[int, float]:
    """rank -> seconds per step over the window (ranks with too few steps left out)."""
    rows = session.execute(
        select(Metric.rank, func.count(func.distinct(Metric.step)), func.min(Metric.step),
               func.max(Metric.step), func.min(Metric.ts), func.max(Metric.ts))
        .where(Metric.job_id == job.id, Metric.attempt == job.attempt,
               Metric.step.is_not(None), Metric.rank.is_not(None), Metric.ts >= since)
        .group_by(Metric.rank))
    out: dict[int, float] = {}
    for rank, steps, low, high, first, last in rows:
        if None in (rank, low, high, first, last):
            continue
        span, took = int(high or 0) - int(low or 0), float(last or 0) - float(first or 0)
        if int(steps) >= MIN_STEPS and span > 0 and took > 0:
            out[int(rank or 0)] = took / span
    return out


def slowest(found: dict[int, float], factor: float) -> tuple[int, float, float] | None:
    """(rank, its seconds per step, the others' median) for the slowest rank over the
    factor: the others' median, so one slow rank of two is seen as well as one of many."""
    worst: tuple[int, float, float] | None = None
    for rank, rate in found.items():
        others = [r for k, r in found.items() if k != rank]
        if not others:
            continue
        median = statistics.median(others)
        if median > 0 and rate > factor * median and (worst is None or
                                                      rate / median > worst[1] / worst[2]):
            worst = (rank, rate, median)
    return worst


def _node_of(session: Session, job: Job, attempt: Attempt, rank: int) -> str | None:
    per_node = (job.spec.get("distribution") or {}).get("processes_per_node")
    if not isinstance(per_node, int) or per_node < 1:
        per_node = 1
    index = rank // per_node
    ids = list(attempt.node_ids or [])
    node = session.get(Node, ids[index]) if index < len(ids) else None
    return node.name if node is not None else None


def look(session: Session, job: Job) -> None:
    """After a batch of metrics with steps: name the straggler of the job's attempt, or
    note that it caught up; an event only when that changes."""
    window, factor = settings()
    stamp = now()
    if not _due(job.id, stamp, min(10.0, window / 20)):
        return
    attempt = session.scalar(select(Attempt).where(Attempt.job_id == job.id,
                                                   Attempt.number == job.attempt))
    if attempt is None:
        return
    measured = rates(session, job, stamp - window)
    if len(measured) < 2:
        return  # nothing to compare (yet, or any more): what was named stays named
    found = slowest(measured, factor)
    before = attempt.straggler or {}
    if found is None:
        if before.get("rank") is not None:
            common.record(session, "job", job.id, job.state, job.state,
                          f"straggler: rank {before['rank']} keeps up again")
            attempt.straggler = None
        return
    rank, rate, median = found
    node = _node_of(session, job, attempt, rank)
    ratio = rate / median
    attempt.straggler = {"rank": rank, "node": node, "seconds_per_step": round(rate, 4),
                         "median_seconds_per_step": round(median, 4),
                         "ratio": round(ratio, 2), "window_s": window, "at": stamp}
    if before.get("rank") != rank:
        common.record(session, "job", job.id, job.state, job.state, (
            f"straggler: rank {rank} on node {node} takes {rate:.3g} s a step, {ratio:.1f}x "
            f"the median of the other ranks ({median:.3g} s) over the last {window:g} s"))


def text(found: dict[str, Any] | None) -> str | None:
    """How ``job show`` says it."""
    if not found:
        return None
    return (f"rank {found['rank']} on {found.get('node')}: {found['seconds_per_step']:g} s a "
            f"step, {found['ratio']:g}x the others' median ({found['median_seconds_per_step']:g}"
            f" s)")
