"""How an attempt ends: what its launchers' last reports (and why it was stopped) make of it,
and what that does to its job — succeeded, failed, canceled, requeued after a preemption, or
retried — and to its nodes."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.backends.base import GangStatus
from batchyard.server import failures, queue_mirror
from batchyard.server.scheduling import set_state
from batchyard.server.services import checkpoints, keepalive, queued
from batchyard.server.services.interrupts import REQUEUE_REASONS
from batchyard.store.models import Attempt, Job, Node, now

log = logging.getLogger("batchyard.reconciler")

Outcome = tuple[str, str | None, int | None, dict[str, Any] | None]


def node_names(attempt: Attempt) -> list[str]:
    names = list((attempt.handle or {}).get("node_names") or [])
    return names + [f"node {i}" for i in range(len(names), len(attempt.node_ids))]


def outcome_of(job: Job, attempt: Attempt, status: GangStatus) -> Outcome:
    """(outcome, message, exit code, failure cause) of an attempt whose launchers are done."""
    names = node_names(attempt)
    abort = dict((attempt.control or {}).get("abort") or {})
    by_state: dict[str, list[Any]] = {}
    for node in status.nodes:
        by_state.setdefault(node.state, []).append(node)
    exit_code: int | None = None
    if attempt.cancel_reason == "user":
        outcome, message = "canceled", job.stop_reason or "terminated by user"
    elif (attempt.handle or {}).get("queue_ended"):
        outcome = "requeue" if attempt.cancel_reason in REQUEUE_REASONS else "failed"
        message = str(attempt.handle["queue_ended"])  # type: ignore[index]
    elif attempt.cancel_reason in REQUEUE_REASONS:
        outcome, message = "requeue", attempt.message or "interrupted"
        if attempt.cancel_reason == "preempted" or (attempt.control or {}).get(
                "cancel", {}).get("notice"):
            message = f"{message}; {checkpoints.lost_text(job, attempt, status)}"
    elif attempt.cancel_reason == "deallocated":
        outcome, message = "failed", attempt.message or "node removed by a resize"
    elif abort:
        outcome, message = "failed", str(abort.get("message"))
        exit_code = abort.get("exit_code")
        remote = _mpi_culprit(status)
        if remote and message.startswith("mpirun on node"):
            rank, exit_code, node_name = remote
            message = f"MPI rank {rank} on node {node_name} exited with code {exit_code}"
    elif attempt.cancel_reason == "lost":
        outcome, message = "failed", attempt.message or "a node was lost"
    elif "failed" in by_state:
        first = by_state["failed"][0]
        outcome, message, exit_code = "failed", first.message or "failed", first.exit_code
    elif "lost" in by_state:
        node = by_state["lost"][0]
        outcome = "failed"
        message = f"node launcher on {names[node.node_rank]} died"
        if node.message and names[node.node_rank] in node.message:
            message = node.message  # why it is lost (server/silence.py's words)
    elif "timeout" in by_state:
        outcome, message = "failed", by_state["timeout"][0].message or "timed out"
    elif set(by_state) == {"succeeded"}:
        outcome, message, exit_code = "succeeded", None, 0
    else:
        first = status.nodes[0]
        outcome, message = "failed", first.message or f"ended as {first.state}"
    error, message = failures.explain(attempt, status, names, outcome, message)
    return outcome, message, exit_code, error


def end_attempt(session: Session, job: Job, attempt: Attempt, outcome: str,
                message: str | None, exit_code: int | None,
                error: dict[str, Any] | None = None) -> None:
    attempt.state = "preempted" if outcome == "requeue" else outcome
    attempt.message = message
    attempt.error = error
    keepalive.on_end(job, attempt)
    release_queue(session, job, attempt)
    attempt.exit_code = exit_code
    attempt.ended_at = now()
    for node in session.scalars(select(Node).where(Node.job_id == job.id)):
        node.job_id = None
        if node.state == "running":
            node.state = "idle"
            node.idle_since = now()
    if outcome == "requeue" and job.cancel_requested:
        outcome, message = "canceled", job.stop_reason or "terminated by user"
    if outcome == "requeue":  # preemption is not the job's fault: no retry is used up
        queue_mirror.changed(session, job.id)
        job.pending_reason = "waiting for nodes to return after preemption"
        cause = f" ({error['cause']})" if error else ""
        if cause and cause.strip() in (message or ""):
            cause = ""
        set_state(session, job, "queued", f"attempt {attempt.number}{cause}: "
                        f"{message}; requeued")
        return
    limits = job.spec.get("limits") or {}
    # a node lost is retried however the server learnt of it: the launcher's silence
    # (cancel reason "lost"), or every launcher gone before a pass saw one alive, or the
    # lost node's collateral failures arriving first (the cause says so)
    retryable = attempt.cancel_reason == "lost" or (
        attempt.cancel_reason is None and (error or {}).get("cause") == "node lost") or (
        exit_code is not None and exit_code in (limits.get("retry_exit_codes") or []))
    if outcome == "failed" and retryable and job.attempt <= int(limits.get("max_retries", 0)):
        queue_mirror.changed(session, job.id)
        job.pending_reason = "waiting to retry"
        set_state(session, job, "queued", f"attempt {attempt.number} failed: "
                        f"{message}; retrying")
        return
    if outcome == "succeeded":
        set_state(session, job, "finalizing", None)
    job.exit_code = exit_code
    job.message = message
    job.error = error if outcome == "failed" else None
    job.ended_at = now()
    set_state(session, job, outcome, message)
    if outcome == "failed":  # limits.keep_alive_on_failure: its nodes stay for job exec
        keepalive.hold(session, job, attempt)


def release_queue(session: Session, job: Job, attempt: Attempt) -> None:
    """An attempt stopped from outside (terminate, a lost node, preemption) leaves nothing
    in the backend's queue (scancel is idempotent). One whose launchers all ended by
    themselves is left to end as it did (COMPLETED or FAILED in Slurm's records)."""
    backend = queued.queue_backend(session, job)
    if attempt.cancel_reason is None and attempt.state in ("succeeded", "failed"):
        return
    if backend is not None and attempt.handle:
        try:
            backend.cancel(attempt.handle)
        except Exception as exc:
            log.warning("attempt %s: cancelling it in the queue failed: %s", attempt.id, exc)


def _mpi_culprit(status: GangStatus) -> tuple[int, int, str] | None:
    """The first MPI rank that failed on a node without mpirun, as that node reported it."""
    found = [(n.raw.get("mpi_failed_at") or 0, n.raw["mpi_failed"]) for n in status.nodes
             if n.raw.get("mpi_failed")]
    if not found:
        return None
    rank, code, node = min(found)[1]
    return int(rank), int(code), str(node)
