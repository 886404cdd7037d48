"""The store side of dependencies and array throttles: views of the queued jobs that have
either, the states of the jobs they name, and applying the verdict of
``scheduler.holds.evaluate`` (pending reasons, jobs failed because a dependency can no longer
be met). Jobs with neither pass straight through, costing nothing."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from batchyard.scheduler.holds import RUNNING, DepView, HoldView, evaluate
from batchyard.server.services import common
from batchyard.spec.arrays import parse_array
from batchyard.store.models import Job, now


def array_limit(job: Job) -> int | None:
    """The ``%N`` of the job's array (how many of its jobs may run at once), if any."""
    text = job.spec.get("array")
    if not text:
        return None
    try:
        return parse_array(str(text)).limit
    except ValueError:
        return None


def apply(session: Session, queued: list[Job]) -> list[Job]:
    """The queued jobs that may be scheduled this pass, in their order. Those held back get
    a pending reason naming what they wait for; those whose dependency can never be met are
    failed, with the reason, and a job waiting for one of them fails in the same pass."""
    held = [j for j in queued if j.depends_on or (j.array_name and array_limit(j))]
    if not held:
        return queued
    dep_ids = {int(d["job_id"]) for j in held for d in (j.depends_on or [])}
    states: dict[int, str] = {}
    if dep_ids:
        states = dict(session.execute(select(Job.id, Job.state).where(
            Job.id.in_(dep_ids))).tuples().all())
    arrays = {(j.experiment_id, j.array_name) for j in held if j.array_name}
    running: dict[tuple[int, str], int] = {}
    for exp_id, name in arrays:
        assert name is not None
        running[(exp_id, name)] = int(session.scalar(select(func.count(Job.id)).where(
            Job.experiment_id == exp_id, Job.array_name == name,
            Job.state.in_(tuple(RUNNING)))) or 0)
    views = [HoldView(
        j.id, tuple(DepView(int(d["job_id"]), str(d["job"]), str(d["condition"]))
                    for d in (j.depends_on or [])),
        (j.experiment_id, j.array_name) if j.array_name else None,
        j.array_index or 0, array_limit(j)) for j in held]
    verdict = evaluate(views, states, running)
    for job in held:
        if job.id in verdict.failed:
            message = verdict.failed[job.id]
            job.state = "failed"
            job.message = message
            job.pending_reason = None
            job.ended_at = now()
            common.record(session, "job", job.id, "queued", "failed", message)
        elif job.id in verdict.pending and job.pending_reason != verdict.pending[job.id]:
            job.pending_reason = verdict.pending[job.id]
    go = set(verdict.runnable)
    held_ids = {j.id for j in held}
    return [j for j in queued if j.id in go or j.id not in held_ids]
