"""``limits.keep_alive_on_failure``: a failed gang's nodes stay reserved for a while so that
``job exec`` can look at its directories and its container (its processes are gone). The job
is ``failed`` at once, with its cause, as without keep-alive; its pending note says until
when the nodes are held. The reconciler lets them go when that time is up, on
``job terminate``, or at once where the job is retried or requeued instead."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.server.services import channel, common
from batchyard.states import ATTEMPT_ENDED, JOB_TERMINAL
from batchyard.store.models import Attempt, Job, Node, now


def seconds(job: Job) -> float | None:
    value = (job.spec.get("limits") or {}).get("keep_alive_on_failure")
    return float(value) if value else None


def held_until(attempt: Attempt | None) -> float | None:
    """Until when this ended attempt's nodes are held for job exec (None: not held)."""
    handle: dict[str, Any] = (attempt.handle or {}) if attempt is not None else {}
    until = handle.get("held_until")
    if until is None or handle.get("released_at") is not None or float(until) <= now():
        return None
    return float(until)


def holding(attempt: Attempt) -> bool:
    """Its launchers that wait for job exec are to be left running: the attempt has not
    ended yet (whether it holds is decided as it ends), or it holds its nodes."""
    return attempt.state not in ATTEMPT_ENDED or held_until(attempt) is not None


def held_attempt_of(session: Session, node: Node) -> Attempt | None:
    """The ended attempt whose failed gang holds ``node`` for job exec, if any."""
    if node.job_id is None:
        return None
    job = session.get(Job, node.job_id)
    if job is None or job.state not in JOB_TERMINAL:
        return None
    attempt = session.scalars(select(Attempt).where(Attempt.job_id == job.id)
                              .order_by(Attempt.number.desc())).first()
    return attempt if held_until(attempt) is not None else None


def note(until: float) -> str:
    clock = time.strftime("%H:%M:%S", time.gmtime(until))
    return (f"nodes held until {clock} UTC for `job exec` (limits.keep_alive_on_failure); "
            "`job terminate` releases them")


def on_end(job: Job, attempt: Attempt) -> None:
    """Every ending attempt: its launchers waiting to keep their nodes are told to go, unless
    ``hold`` keeps them in the same transaction."""
    if seconds(job):
        channel.update_control(attempt, release=True)


def hold(session: Session, job: Job, attempt: Attempt) -> None:
    """The job failed for good: its attempt's nodes stay its own for the keep-alive time."""
    wanted = seconds(job)
    if not wanted or not attempt.node_ids:
        return
    until = (attempt.ended_at or now()) + wanted
    control = dict(attempt.control or {})
    control.pop("release", None)
    channel.set_control(attempt, control)
    attempt.handle = {**(attempt.handle or {}), "held_until": until}
    for node in session.scalars(select(Node).where(Node.id.in_(attempt.node_ids))):
        if node.job_id is None and node.state in ("idle", "running"):
            node.job_id = job.id
            node.state = "running"
            node.idle_since = None
    job.pending_reason = note(until)
    common.record(session, "job", job.id, job.state, job.state, job.pending_reason)


def expire(session: Session) -> bool:
    """One reconciler pass: release the held nodes whose time is up or whose job was
    terminated meanwhile. True while some are still held (time alone will release them)."""
    # ids first: PostgreSQL cannot DISTINCT rows holding JSON columns
    ids = sorted(set(session.scalars(select(Job.id).join(Node, Node.job_id == Job.id)
                                     .where(Job.state.in_(JOB_TERMINAL)))))
    held = list(session.scalars(select(Job).where(Job.id.in_(ids)))) if ids else []
    still = False
    for job in held:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job.id)
                                  .order_by(Attempt.number.desc())).first()
        if job.cancel_requested:
            release(session, job, attempt, "released by job terminate")
        elif held_until(attempt) is None:
            release(session, job, attempt, "keep-alive time is up: nodes released")
        else:
            still = True
    return still


def release(session: Session, job: Job, attempt: Attempt | None, why: str) -> None:
    for node in session.scalars(select(Node).where(Node.job_id == job.id)):
        node.job_id = None
        if node.state == "running":
            node.state = "idle"
            node.idle_since = now()
    if attempt is not None:
        attempt.handle = {**(attempt.handle or {}), "released_at": now()}
        channel.update_control(attempt, release=True)
    job.pending_reason = None
    common.record(session, "job", job.id, job.state, job.state, why)


def terminate(session: Session, job: Job) -> bool:
    """``job terminate`` on a failed job whose nodes are held: let them go (next pass)."""
    attempt = session.scalars(select(Attempt).where(Attempt.job_id == job.id)
                              .order_by(Attempt.number.desc())).first()
    if held_until(attempt) is None or job.cancel_requested:
        return False
    job.cancel_requested = True
    common.record(session, "job", job.id, job.state, job.state, "terminate requested: "
                  "releasing the nodes held for job exec")
    return True
