"""Gangs on a backend with a queue of its own (Slurm). The job is handed over at once and stays
``queued`` in batchyard, with the backend's own pending reason, until the backend starts it;
only then are its nodes known, and the attempt is bound to them (by the reconciler following
the queue, or by the first launcher asking for its plan, whichever comes first)."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.backends import get_backend
from batchyard.backends.base import (
    QueueState,
    SupportsQueue,
    SupportsStartReport,
    has_queue,
    implements,
)
from batchyard.errors import ServerUnavailable
from batchyard.server import queue_mirror
from batchyard.server.services import common
from batchyard.store.models import Attempt, Cluster, Job, Node, NodeReport, now


def queue_backend(session: Session, job: Job) -> SupportsQueue | None:
    cluster = session.get(Cluster, job.cluster_id)
    backend = get_backend(cluster.backend) if cluster is not None else None
    return backend if has_queue(backend) else None


def is_unbound(attempt: Attempt) -> bool:
    return not attempt.node_ids


def bind(ctx: Any, session: Session, attempt: Attempt, job: Job, state: QueueState) -> None:
    """The backend started the gang on these nodes (node rank order): the attempt takes them,
    with a report row per node waiting for its launcher, and the job starts preparing."""
    from batchyard.server import discovery
    from batchyard.server.services.channel import launch_token, token_hash

    cluster = session.get(Cluster, job.cluster_id)
    assert cluster is not None
    rows = _rows(session, cluster)
    if any(name not in rows for name in state.nodes):
        discovery.sync(session, cluster)  # a node that joined the partition since the last look
        rows = _rows(session, cluster)
    missing = [name for name in state.nodes if name not in rows]
    if missing or not state.nodes:
        raise ServerUnavailable(f"Slurm job {state.external_id} runs on {', '.join(missing)}, "
                                f"not known in cluster {cluster.name!r} yet")
    chosen = [rows[name] for name in state.nodes]
    for node in chosen:
        node.job_id = job.id
        node.state = "running"
        node.idle_since = None
    attempt.node_ids = [n.id for n in chosen]
    attempt.handle = {**(attempt.handle or {}), "node_names": list(state.nodes)}
    attempt.state = "preparing"
    have = {r.node_rank for r in session.scalars(select(NodeReport).where(
        NodeReport.attempt_id == attempt.id))}
    for rank, node in enumerate(chosen):
        if rank not in have:
            session.add(NodeReport(attempt_id=attempt.id, node_rank=rank, node_id=node.id,
                                   token_hash=token_hash(launch_token(ctx, attempt.uuid, rank)),
                                   seq=0, state="starting", data={}, created_at=now()))
    placed = ", ".join(state.nodes)
    if job.state == "queued":
        common.record(session, "job", job.id, job.state, "preparing",
                      f"placed on {placed} by Slurm (job {state.external_id})")
        job.state = "preparing"
        queue_mirror.changed(session, job.id)
    job.pending_reason = None
    session.flush()


def bind_for_plan(ctx: Any, session: Session, attempt: Attempt, node_rank: int = 0,
                  allocation: dict[str, str] | None = None) -> None:
    """A launcher asks for its plan before the reconciler saw the job start: the gang runs
    where the launcher says it does (``allocation``: the start callback), or, when it says
    nothing the backend can vouch for, where the queue says. Committed under the control
    lock (the reconciler may be binding it too); the reconciler follows it from now."""
    from batchyard.server.services.channel import CONTROL_LOCK, hold_control

    with CONTROL_LOCK:
        hold_control(session)
        session.refresh(attempt)
        if not attempt.node_ids:
            _bind_reported(ctx, session, attempt, node_rank, allocation)
            session.commit()
            ctx.kick()


def _bind_reported(ctx: Any, session: Session, attempt: Attempt, node_rank: int,
                   allocation: dict[str, str] | None) -> None:
    job = session.get(Job, attempt.job_id)
    assert job is not None
    backend = queue_backend(session, job)
    if backend is None or attempt.handle is None:
        raise ServerUnavailable("the attempt is not launched yet")
    state = None
    if allocation and implements(backend, SupportsStartReport):
        state = cast(SupportsStartReport, backend).started_from(attempt.handle, node_rank,
                                                                allocation)
    if state is None:
        state = backend.queue_state(attempt.handle, fresh=True)  # it runs: the launcher asks
    if state.state != "running":
        raise ServerUnavailable(f"the backend has not started the gang yet ({state.reason})")
    bind(ctx, session, attempt, job, state)


def _rows(session: Session, cluster: Cluster) -> dict[str, Node]:
    return {n.name: n for n in session.scalars(select(Node).where(
        Node.cluster_id == cluster.id))}
