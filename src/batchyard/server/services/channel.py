"""The server side of the node channel (DESIGN §8): launcher credentials, the plan a node
fetches, state reports applied at most once, log chunks appended exactly once, the control a
launcher long-polls (cancel, abort, finish, relay execs), the gang's port rendezvous and the
workspace datastore that receives outputs. The server's view of an attempt is only what
arrived here; it never reads a node's files."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, event, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, SessionTransaction, object_session

from batchyard.backends.base import Gang, GangStatus, NodeStatus
from batchyard.backends.plans import build_plans
from batchyard.config import data_root
from batchyard.errors import Conflict, NotFound, SpecError
from batchyard.launchplan import container_report
from batchyard.server import notify
from batchyard.server.context import ServerContext
from batchyard.server.registry import live_urls
from batchyard.server.services import gpu_usage
from batchyard.server.services.clusters import node_info
from batchyard.server.services.log_chunks import append_logs  # noqa: F401 (the channel's API)
from batchyard.server.services.node_credentials import (  # noqa: F401 (the channel's API)
    Forbidden,
    check_launcher,
    job_token,
    launch_token,
    token_hash,
)
from batchyard.states import ATTEMPT_ENDED, LAUNCHER_TERMINAL
from batchyard.store.db import Database
from batchyard.store.models import (
    Attempt,
    Cluster,
    Experiment,
    Job,
    Node,
    NodeReport,
    Workspace,
    now,
)

# A launcher's last word; "preempted" is what it ends as when the attempt is interrupted for a
# requeue (a cancel with that state).
NODE_TERMINAL = LAUNCHER_TERMINAL
ENDED_ATTEMPT = ATTEMPT_ENDED
HEARD_EVERY = 2.0  # s: a launcher's heard_at is written at most this often
# An attempt's control (cancel, abort, finish, relay execs, rendezvous) is one JSON value that
# the API and the reconciler both update: every transaction that may change it holds this
# lock from its read to its commit, so no update is lost. Several server processes on one
# PostgreSQL database (workers, a standby) also take CONTROL_KEY (``control_session``).
CONTROL_LOCK = threading.RLock()
CONTROL_KEY = 0x6279636C  # "bycl"
_CONTROL_HELD = "control_lock"
_TAKE_CONTROL = text("SELECT pg_advisory_xact_lock(:k)").bindparams(k=CONTROL_KEY)


@contextmanager
def control_session(db: Database) -> Iterator[Session]:
    """A session that holds the control lock in every transaction it runs."""
    with CONTROL_LOCK, db.session() as session:
        hold_control(session)
        yield session


def hold_control(session: Session) -> None:
    """The cross-process half of CONTROL_LOCK (the caller holds that): on PostgreSQL a
    transaction-level advisory lock, taken now and again at the start of each later
    transaction of ``session`` (a commit releases it). Objects read before it may be stale:
    take it first."""
    if session.info.get(_CONTROL_HELD) or session.get_bind().dialect.name != "postgresql":
        return
    session.info[_CONTROL_HELD] = True
    if session.in_transaction():
        session.execute(_TAKE_CONTROL)
    else:
        session.connection()  # begins: _take_control_again takes it


@event.listens_for(Session, "after_begin")
def _take_control_again(session: Session, transaction: SessionTransaction,
                        connection: Connection) -> None:
    if session.info.get(_CONTROL_HELD):
        connection.execute(_TAKE_CONTROL)


# --- gangs and plans ----------------------------------------------------------------------

def _attempt(session: Session, attempt_uuid: str) -> Attempt:
    attempt = session.scalar(select(Attempt).where(Attempt.uuid == attempt_uuid))
    if attempt is None:
        raise NotFound(f"attempt {attempt_uuid} not found")
    return attempt


def gang_for(ctx: ServerContext, session: Session, attempt: Attempt) -> Gang:
    from batchyard.server.services.jobs import launch_spec

    job = session.get(Job, attempt.job_id)
    assert job is not None
    ws = session.get(Workspace, job.workspace_id)
    exp = session.get(Experiment, job.experiment_id)
    assert ws is not None and exp is not None
    nodes = [session.get(Node, i) for i in attempt.node_ids]
    if any(n is None for n in nodes):
        raise Conflict(f"a node of attempt {attempt.number} of job {job.name!r} is gone")
    code = job.spec.get("code")
    archive = code.split(":", 1)[1] if isinstance(code, str) and code.startswith(
        "snapshot:") else None
    cluster = session.get(Cluster, job.cluster_id)
    count = len(nodes) or int(job.spec.get("nodes", 1))  # unbound: a queueing backend's gang
    return Gang(
        job_id=job.id, job_name=job.name, workspace=ws.name, experiment=exp.name,
        attempt=attempt.number, attempt_uuid=attempt.uuid, attempt_dir=attempt.directory,
        checkpoint_dir="", spec=launch_spec(session, job, exp.name),
        nodes=[node_info(n) for n in nodes if n is not None], api_url=ctx.api_url,
        api_token=job_token(ctx, job.id, attempt.uuid), code_archive=archive,
        server_url=(own := ctx.node_url or ctx.api_url),
        servers=[u for u in live_urls(session) if u != own.rstrip("/")],
        launch_tokens=[launch_token(ctx, attempt.uuid, r) for r in range(count)],
        nodes_wanted=count, cluster_spec=dict(cluster.spec) if cluster else {},
        cluster_size=dict(cluster.size) if cluster else {}, ca_file=ctx.tls_ca,
        created_by=job.created_by, hidden=server_hidden(ctx),
        shared=[str(data_root() / "datastores" / ws.name)],
    )


def server_hidden(ctx: ServerContext) -> list[str]:
    """What every job's sandbox hides besides its node's own folders: the server's home,
    data root and TLS key, at whatever paths they have on the node's machine."""
    from batchyard.config import home

    return list(dict.fromkeys([str(home()), str(data_root()),
                               str(Path.home() / ".batchyard"), *ctx.tls_files]))


def prepare_launch(ctx: ServerContext, session: Session, attempt: Attempt) -> Gang:
    """The gang to hand the backend, and a report row per node waiting for its launcher."""
    gang = gang_for(ctx, session, attempt)
    job = session.get(Job, attempt.job_id)
    assert job is not None
    digest = token_hash(gang.api_token or "")
    gang.maybe_submitted = job.token_hash == digest  # committed by a launch made before
    job.token_hash = digest
    have = {r.node_rank for r in session.scalars(select(NodeReport).where(
        NodeReport.attempt_id == attempt.id))}
    for rank, node_id in enumerate(attempt.node_ids):
        if rank not in have:
            session.add(NodeReport(attempt_id=attempt.id, node_rank=rank, node_id=node_id,
                                   token_hash=token_hash(gang.launch_tokens[rank]), seq=0,
                                   state="starting", data={}, created_at=now()))
    session.flush()
    return gang


def plan_for(ctx: ServerContext, session: Session, attempt_uuid: str, node_rank: int,
             allocation: dict[str, str] | None = None) -> dict[str, Any]:
    attempt = _attempt(session, attempt_uuid)
    if attempt.state in ENDED_ATTEMPT:
        raise Conflict(f"attempt {attempt_uuid} has ended")
    if not attempt.node_ids:
        from batchyard.server.services.queued import bind_for_plan

        bind_for_plan(ctx, session, attempt, node_rank, allocation)
    plans = build_plans(gang_for(ctx, session, attempt))
    if not 0 <= node_rank < len(plans):
        raise NotFound(f"attempt {attempt_uuid} has no node {node_rank}")
    return plans[node_rank].to_dict()


def snapshot_path(ctx: ServerContext, session: Session, attempt_uuid: str, sha: str) -> Path:
    attempt = _attempt(session, attempt_uuid)
    job = session.get(Job, attempt.job_id)
    assert job is not None
    if job.spec.get("code") != f"snapshot:{sha}":
        raise Forbidden("this attempt's code is another snapshot")
    path = ctx.snapshots / f"{sha}.tar.gz"
    if not path.is_file():
        raise NotFound(f"snapshot {sha[:12]} not found")
    return path


# --- reports ------------------------------------------------------------------------------

def _report(session: Session, attempt: Attempt, node_rank: int) -> NodeReport:
    row = session.scalar(select(NodeReport).where(NodeReport.attempt_id == attempt.id,
                                                  NodeReport.node_rank == node_rank))
    if row is None:
        raise NotFound(f"attempt {attempt.uuid} has no node {node_rank}")
    return row


def _note_containers(session: Session, row: NodeReport, found: Any) -> None:
    """What a launcher found of its node's container runtime (its images after a pull)
    becomes the node's (``cluster node list``)."""
    if not isinstance(found, dict) or row.node_id is None:
        return
    node = session.get(Node, row.node_id)
    if node is None:
        return
    view = container_report(found)
    if (node.resources or {}).get("containers") != view:
        node.resources = {**(node.resources or {}), "containers": view}


def apply_report(session: Session, attempt_uuid: str, node_rank: int, seq: int,
                 status: dict[str, Any]) -> dict[str, Any]:
    """At most once: a report is applied only if newer than the last one applied. A node's
    failure becomes the gang's abort at once, so every other node hears it on its poll."""
    attempt = _attempt(session, attempt_uuid)
    row = _report(session, attempt, node_rank)
    stamp = now()
    if row.heard_at is None or stamp - row.heard_at >= HEARD_EVERY:
        row.heard_at = stamp  # a resend or a heartbeat too: this launcher is alive
    if seq > row.seq and row.state not in NODE_TERMINAL:
        row.seq = seq
        state, was = str(status.get("state") or row.state), row.state
        row.state = state
        before, row.data = row.data or {}, dict(status)
        gpu_usage.note_report(session, attempt, row, before, status)  # GPUs left idle?
        row.updated_at = now()
        if state in ("failed", "timeout"):  # a rank, the preparation or staging failed
            _abort_gang(attempt, node_rank, status)
        if state != was or status.get("execs") != before.get("execs"):
            notify.bump(attempt.uuid, session)  # relay execs' results are waited for
        _note_containers(session, row, status.get("containers"))
    control = attempt.control or {}
    # A report the server will never apply (its node already ended, e.g. marked lost) is
    # acknowledged all the same, so the launcher stops resending it.
    acked = max(row.seq, seq) if row.state in NODE_TERMINAL else row.seq
    return {"seq": acked, "version": attempt.control_version,
            "control": _control_for(control, node_rank),
            "servers": live_urls(session)}  # where to go if this server stops answering


def _abort_gang(attempt: Attempt, node_rank: int, status: dict[str, Any]) -> None:
    update_control(attempt, abort={"node": status.get("node"), "node_rank": node_rank,
                                   "rank": status.get("failed_rank"),
                                   "exit_code": status.get("exit_code"),
                                   "message": status.get("message")})


def set_control(attempt: Attempt, control: dict[str, Any]) -> None:
    attempt.control = control
    attempt.control_version = (attempt.control_version or 0) + 1
    notify.bump(attempt.uuid, object_session(attempt))  # the reconciler too: followups.py


def update_control(attempt: Attempt, **changes: Any) -> None:
    control = dict(attempt.control or {})
    fresh = {k: v for k, v in changes.items() if not control.get(k)}
    if fresh:
        control.update(fresh)
        set_control(attempt, control)


def _control_for(control: dict[str, Any], node_rank: int) -> dict[str, Any]:
    execs = (control.get("execs") or {}).get(str(node_rank)) or []
    sessions = (control.get("sessions") or {}).get(str(node_rank)) or []  # job exec
    return {"cancel": control.get("cancel"), "abort": control.get("abort"),
            "finish": bool(control.get("finish")), "execs": {str(node_rank): execs},
            "sessions": {str(node_rank): sessions}, "release": bool(control.get("release")),
            "preflight": control.get("preflight"),
            "checkpointed": control.get("checkpointed"),  # in the preemption notice
            "stacks": list(control.get("stacks") or [])}  # dumps asked of every node


def control_of(session: Session, attempt_uuid: str, node_rank: int) -> tuple[int, dict[str, Any]]:
    attempt = _attempt(session, attempt_uuid)
    control = dict(attempt.control or {})
    if attempt.state in ENDED_ATTEMPT and not control.get("cancel"):
        control["cancel"] = {"state": "canceled", "message": "the attempt has ended",
                             "grace": 3.0}
    return attempt.control_version or 0, _control_for(control, node_rank)


def gang_status(session: Session, attempt: Attempt, alive: list[bool | None],
                silent: dict[int, str] | None = None) -> GangStatus:
    """The attempt as its launchers reported it; a launcher the backend knows is gone without
    a final report is ``lost``, and so is one ``silent`` names (server/silence.py), why."""
    silent = silent or {}
    rows = {r.node_rank: r for r in session.scalars(select(NodeReport).where(
        NodeReport.attempt_id == attempt.id))}
    nodes = []
    for rank in range(len(attempt.node_ids)):
        row = rows.get(rank)
        data = dict(row.data) if row is not None else {}
        state = row.state if row is not None else "starting"
        if state not in NODE_TERMINAL and rank in silent:
            state = "lost"
            data["message"] = silent[rank]
        elif state not in NODE_TERMINAL and rank < len(alive) and alive[rank] is False:
            state = "lost"
            data["message"] = data.get("lost_message") or "node launcher died"
        nodes.append(NodeStatus(node_rank=rank, state=state, exit_code=data.get("exit_code"),
                                message=data.get("message"), failed_rank=data.get("failed_rank"),
                                raw=data))
    return GangStatus(nodes)


def reports(session: Session, attempt: Attempt) -> list[dict[str, Any]]:
    return [dict(r.data, state=r.state, node_rank=r.node_rank) for r in session.scalars(
        select(NodeReport).where(NodeReport.attempt_id == attempt.id)
        .order_by(NodeReport.node_rank))]


_NODE_FIELDS = ("node", "pid", "exit_code", "failed_rank", "message", "started_at",
                "running_at", "ended_at", "updated_at", "preflight")
_RANK_FIELDS = ("rank", "local_rank", "what", "pid", "exit_code")


_REPORTS_OF_ATTEMPT = (select(NodeReport)
                       .where(NodeReport.attempt_id == bindparam("attempt_id"))
                       .order_by(NodeReport.node_rank))


def node_views(session: Session, attempt: Attempt) -> list[dict[str, Any]]:
    """Each node launcher's last report as the API shows it (``job show``): its state, pid
    and the ranks it runs, without the node-local paths and the raw samples."""
    out = []
    for row in session.scalars(_REPORTS_OF_ATTEMPT, {"attempt_id": attempt.id}):
        report = dict(row.data or {})
        view: dict[str, Any] = {"node_rank": row.node_rank, "state": row.state}
        view.update({k: report.get(k) for k in _NODE_FIELDS})
        if view["node"] is None and row.node_id is not None:
            node = session.get(Node, row.node_id)
            view["node"] = node.name if node is not None else None
        view["ranks"] = [{k: r.get(k) for k in _RANK_FIELDS if k in r}
                         for r in report.get("ranks") or [] if isinstance(r, dict)]
        view.update(gpu_usage.node_view(report))  # each GPU's mean, p10, samples, memory
        out.append(view)
    return out


# --- outputs (the workspace datastore) ----------------------------------------------------

def put_output(session: Session, attempt_uuid: str, rel: str, data: bytes,
               sha: str | None) -> dict[str, Any]:
    attempt = _attempt(session, attempt_uuid)
    ident, _, inner = rel.partition("/")
    parts = [p for p in inner.split("/") if p]
    if not ident or not parts or any(p in (".", "..") for p in parts) or "\x00" in rel:
        raise SpecError(f"path: {rel!r} is not OUTPUT_ID/relative/path")
    job = session.get(Job, attempt.job_id)
    assert job is not None
    if ident not in (job.spec.get("outputs") or {}):
        raise SpecError(f"path: the job has no output {ident!r}")
    if sha is not None and hashlib.sha256(data).hexdigest() != sha:
        raise SpecError("X-Content-Sha256: the body does not match its checksum")
    from batchyard.server.services import files

    Path(attempt.directory).parent.parent.mkdir(parents=True, exist_ok=True)
    try:  # never through a link a job planted under outputs/
        folder = files.dir_under(attempt.directory, ["outputs", ident, *parts[:-1]],
                                 create=True)
    except OSError as exc:
        raise SpecError(f"path: {rel!r}: not a plain directory on the server ({exc})") \
            from None
    tmp = f".{parts[-1]}.{uuid.uuid4().hex[:8]}.part"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o640, dir_fd=folder)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, parts[-1], src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)
    return {"path": rel, "size": len(data)}


# --- rendezvous and relay -----------------------------------------------------------------

def publish_ports(session: Session, attempt_uuid: str, node_rank: int,
                  ports: list[int]) -> None:
    attempt = _attempt(session, attempt_uuid)
    control = dict(attempt.control or {})
    rdv = dict(control.get("rendezvous") or {})
    if str(node_rank) in rdv:
        return  # a resend: the first answer stands
    if not ports or not all(isinstance(p, int) and 0 < p < 65536 for p in ports):
        raise SpecError("ports: a list of port numbers")
    rdv[str(node_rank)] = ports
    control["rendezvous"] = rdv
    attempt.control = control
    notify.bump(attempt.uuid, session)


def rendezvous_of(session: Session, attempt_uuid: str) -> dict[str, Any]:
    attempt = _attempt(session, attempt_uuid)
    control = attempt.control or {}
    rdv = control.get("rendezvous") or {}
    count = len(attempt.node_ids)
    stop = attempt.state in ENDED_ATTEMPT or bool(control.get("cancel") or control.get("abort"))
    if len(rdv) < count:
        return {"complete": False, "stop": stop, "have": len(rdv), "want": count}
    return {"complete": True, "ports": [rdv[str(r)] for r in range(count)]}


def relay(session: Session, attempt_uuid: str, host: str, command: str) -> dict[str, Any]:
    """mpirun's rsh agent on one node asks for ``command`` on node ``host``: it goes to that
    node's launcher through its control poll."""
    attempt = _attempt(session, attempt_uuid)
    nodes = [session.get(Node, i) for i in attempt.node_ids]
    target = next((r for r, n in enumerate(nodes) if n is not None and host in (
        n.name, n.address)), None)
    if target is None:
        raise NotFound(f"host {host!r} is not a node of this attempt")
    if not command.strip():
        raise SpecError("command: empty")
    control = dict(attempt.control or {})
    execs = {k: list(v) for k, v in (control.get("execs") or {}).items()}
    ident = f"{target}-{len(execs.get(str(target), [])) + 1}-{uuid.uuid4().hex[:6]}"
    execs.setdefault(str(target), []).append({"id": ident, "command": command})
    control["execs"] = execs
    set_control(attempt, control)
    return {"id": ident, "node_rank": target}


def relay_result(session: Session, attempt_uuid: str, ident: str) -> dict[str, Any]:
    attempt = _attempt(session, attempt_uuid)
    target = ident.split("-", 1)[0]
    if not target.isdigit():
        raise NotFound(f"relay exec {ident!r} not found")
    row = _report(session, attempt, int(target))
    codes = (row.data or {}).get("execs") or {}
    if ident in codes:
        return {"done": True, "exit_code": codes[ident]}
    if row.state in NODE_TERMINAL or attempt.state in ENDED_ATTEMPT:
        return {"done": True, "exit_code": 255, "message": "the node's launcher has ended"}
    return {"done": False}
