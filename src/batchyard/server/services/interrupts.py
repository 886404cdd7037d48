"""Stopping a running attempt for a reason other than the user's terminate: a preempted node,
a node removed by a resize. The reason decides what becomes of the job when the attempt has
ended (see the reconciler): requeued, or failed."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.server import followups
from batchyard.server.services.channel import update_control
from batchyard.states import ATTEMPT_ACTIVE
from batchyard.store.models import Attempt, Job

ACTIVE_ATTEMPT = ATTEMPT_ACTIVE
REQUEUE_REASONS = ("preempted", "requeue")


def interrupt(session: Session, job_id: int, reason: str, message: str, grace: float,
              notice: bool | None = None) -> bool:
    """Ask the backend to stop the job's active attempt; False when there is none or it is
    already being stopped. A preemption (or ``notice``) warns the ranks first: they get
    ``limits.checkpoint_notice`` seconds to save before the SIGTERM (node/notice.py)."""
    job = session.get(Job, job_id)
    if job is None:
        return False
    attempt = session.scalar(select(Attempt).where(Attempt.job_id == job.id,
                                                   Attempt.state.in_(ACTIVE_ATTEMPT))
                             .order_by(Attempt.number.desc()).limit(1))
    if attempt is None or attempt.cancel_reason is not None:
        return False
    attempt.cancel_reason = reason
    attempt.message = message
    state = "preempted" if reason in REQUEUE_REASONS else "canceled"
    warn = reason == "preempted" if notice is None else notice
    seconds = float((job.spec.get("limits") or {}).get("checkpoint_notice", 60.0)) if warn else 0
    request_stop(attempt, state, message, grace, seconds)
    attempt.state = "stopping"
    followups.attempt(session, attempt.id)  # the reconciler follows it to its end
    return True


def request_stop(attempt: Attempt, state: str, message: str, grace: float,
                 notice: float = 0.0) -> None:
    """Every launcher of the attempt hears it on its control poll (idempotent: the first
    request stands)."""
    import time

    update_control(attempt, cancel={"state": state, "message": message, "grace": grace,
                                    "notice": notice, "at": time.time()})
