"""The hang watchdog's decision (``limits.hang_timeout``, ``limits.on_hang``). Each node
launcher reports only whether its own ranks have been idle for the timeout (node/watchdog.py,
timed on that node's clock); a gang hangs when every node of a running attempt says so at
once, which only the server sees. Then every node is asked for a stack dump; once every
dump is in (or DUMP_WAIT has passed) the job's events get ``hung`` with where its ranks
are, and the policy runs: ``dump`` lets it run on (a later hang of the same attempt, after
progress, fires again), ``fail`` ends it failed with that message, ``requeue`` starts a new
attempt (at most max(1, max_retries) times; then it fails).

The state of one hang lives in the attempt's control (``hang``), so a restarted server
carries on where it was. The caller (the reconciler) holds channel.CONTROL_LOCK."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.backends.base import GangStatus
from batchyard.debug.stacks import group, summary
from batchyard.server.services import channel, common, stacks
from batchyard.server.services.interrupts import interrupt
from batchyard.store.models import Attempt, Cluster, Job

DUMP_WAIT = 20.0  # seconds the policy waits for every node's dump before acting anyway
HUNG = "hung"


def timeout_of(session: Session, job: Job) -> float | None:
    limit = (job.spec.get("limits") or {}).get("hang_timeout")
    if limit is None:
        cluster = session.get(Cluster, job.cluster_id)
        limit = (cluster.spec if cluster is not None else {}).get("hang_timeout")
    return float(limit) if limit else None


def gang_idle(attempt: Attempt, status: GangStatus) -> bool:
    """Every node idle; a node whose ranks all ended well has nothing left to do, so a
    rank hanging on another node still hangs the gang."""
    running = [n for n in status.nodes if n.state == "running"]
    return attempt.state == "running" and bool(running) and all(
        n.raw.get("idle") is True for n in running) and all(
        n.state in ("running", "succeeded") for n in status.nodes)


def _set_hang(attempt: Attempt, hang: dict[str, Any] | None) -> None:
    control = dict(attempt.control or {})
    if hang is None:
        control.pop("hang", None)
    else:
        control["hang"] = hang
    channel.set_control(attempt, control)


def watch(session: Session, job: Job, attempt: Attempt, status: GangStatus) -> None:
    """One look per reconciler pass; cheap unless a node says it is idle."""
    hang = (attempt.control or {}).get("hang")
    if hang is None:
        if gang_idle(attempt, status):
            meta = stacks.request(session, attempt, "hang")
            _set_hang(attempt, {"id": meta["id"], "at": time.time(), "acted": False})
        return
    if hang.get("acted"):
        if attempt.state == "running" and not gang_idle(attempt, status):
            _set_hang(attempt, None)  # progress again: a later hang fires anew
        return
    found = stacks.collect(attempt, str(hang["id"]))
    if found["missing"] and time.time() - float(hang["at"]) < DUMP_WAIT \
            and attempt.state == "running":
        return
    _act(session, job, attempt, found)
    _set_hang(attempt, {**hang, "acted": True})


def wait_left(attempt: Attempt) -> float | None:
    """Seconds until a hang waiting for its stack dumps acts anyway (each dump that arrives
    marks the attempt too: server/followups.py)."""
    hang = (attempt.control or {}).get("hang")
    if hang is None or hang.get("acted"):
        return None
    return max(0.0, float(hang["at"]) + DUMP_WAIT - time.time())


def describe(session: Session, job: Job, found: dict[str, Any]) -> str:
    """"hung: no rank progressed for 5s (...): rank 3 in f (a.py:3); ranks 0-2 in ..."."""
    limit = timeout_of(session, job)
    text = f"hung: no rank progressed for {limit:g}s" if limit else "hung"
    text += f" (no output, metric or heartbeat): {summary(group(found['dumps']))}"
    if found["missing"]:
        text += f"; no stack dump from {', '.join(found['missing'])}"
    return text + f"; stacks: batchyard job stacks {job.name} --id {found['id']}"


def _act(session: Session, job: Job, attempt: Attempt, found: dict[str, Any]) -> None:
    message = describe(session, job, found)
    policy = str((job.spec.get("limits") or {}).get("on_hang") or "dump")
    common.record(session, "job", job.id, job.state, HUNG, message)
    if policy == "requeue":
        earlier = sum(1 for a in session.scalars(select(Attempt).where(
            Attempt.job_id == job.id, Attempt.id != attempt.id))
            if a.cancel_reason == "requeue" and (a.message or "").startswith(HUNG))
        allowed = max(1, int((job.spec.get("limits") or {}).get("max_retries") or 0))
        if earlier < allowed:
            grace = float((job.spec.get("limits") or {}).get("grace_period", 30.0))
            interrupt(session, job.id, "requeue", message, grace)
            return
        message += f" (it hung in {earlier + 1} attempts)"
        policy = "fail"
    if policy == "fail" and attempt.cancel_reason is None:
        attempt.cancel_reason = HUNG
        attempt.message = message
        channel.update_control(attempt, abort={"node": None, "node_rank": None, "rank": None,
                                               "exit_code": None, "message": message,
                                               "cause": HUNG})
