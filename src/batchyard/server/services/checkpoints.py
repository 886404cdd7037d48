"""The checkpoints jobs report complete (``batchyard.checkpoint_saved``, issue 36 §2): the
launchers pass each on in their status; the job keeps the last one across attempts. A
preemption chooses its victims by the work done since, and says what it lost."""

from __future__ import annotations

import time
from typing import Any

from batchyard.backends.base import GangStatus
from batchyard.store.models import Attempt, Job


def note(job: Job, status: GangStatus) -> None:
    """The newest checkpoint any node of the gang reported becomes the job's."""
    reported = [n.raw["checkpoint"] for n in status.nodes
                if isinstance(n.raw.get("checkpoint"), dict)
                and isinstance(n.raw["checkpoint"].get("at"), int | float)]
    if not reported:
        return
    newest = max(reported, key=lambda c: float(c["at"]))
    if job.checkpoint is None or float(newest["at"]) > float(job.checkpoint.get("at") or 0):
        job.checkpoint = {"at": float(newest["at"]), "step": newest.get("step")}


def tell_gang(job: Job, attempt: Attempt) -> None:
    """A checkpoint reported during a preemption notice ends it on every node of the gang,
    not only on the one whose rank saved (node 0, usually)."""
    from batchyard.server.services.channel import update_control

    cancel = (attempt.control or {}).get("cancel") or {}
    saved = job.checkpoint or {}
    if cancel.get("notice") and saved.get("at") and float(saved["at"]) >= float(
            cancel.get("at") or 0):
        update_control(attempt, checkpointed=saved)


def work_since(job_checkpoint: dict[str, Any] | None, started: float) -> float:
    """When the work a stop now would lose began: the last checkpoint, or the attempt's start
    (a checkpoint from before it still is where a new attempt resumes)."""
    at = float((job_checkpoint or {}).get("at") or 0.0)
    return max(at, 0.0) if at else started


def lost_text(job: Job, attempt: Attempt, status: GangStatus) -> str:
    """'preempted 40 s after its last checkpoint (step 1200)': the SIGTERM's time (the end of
    the notice) against the last checkpoint, or the attempt's start when none was reported."""
    stops = [float(n.raw["sigterm_at"]) for n in status.nodes
             if isinstance(n.raw.get("sigterm_at"), int | float)]
    stopped = min(stops) if stops else time.time()
    saved = job.checkpoint or {}
    if saved.get("at"):
        lost = max(0.0, stopped - float(saved["at"]))
        step = f" (step {saved['step']})" if saved.get("step") is not None else ""
        return f"preempted {lost:.0f} s after its last checkpoint{step}"
    began = attempt.started_at or attempt.created_at or stopped
    return f"preempted {max(0.0, stopped - began):.0f} s after its start, with no checkpoint " \
           "reported"
