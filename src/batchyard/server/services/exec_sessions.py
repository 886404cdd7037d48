"""``job exec`` and ``cluster node exec -it`` sessions on the server: the meeting point of a
client's WebSocket and the node that runs the command.

A node cannot be reached from here, so a job's session goes into its attempt's control
(``sessions``) and that node's launcher calls back (node/session.py): output chunks come up in
sequence (a resend is taken once), input, window sizes and the client's end go down. A local
cluster's node is this machine: ``cluster node exec -it`` runs its command here, in the node's
directory. Sessions live in this process's memory (a server restart ends them, as a dropped
``kubectl exec`` connection does); each one is recorded in the job's events. A machine's
node (``batchyard agent``) gets its session as a command with its heartbeat, and its agent
relays it the same way over its own credential."""

from __future__ import annotations

import shlex
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from batchyard.errors import Conflict, Forbidden, NotFound, SpecError, Unsupported
from batchyard.server import notify, workers
from batchyard.server.auth import Principal
from batchyard.server.context import ServerContext
from batchyard.server.services import channel, common, keepalive
from batchyard.states import LAUNCHER_TERMINAL
from batchyard.store.models import Attempt, Job, Node, NodeCommand, NodeReport, now

START_DEADLINE = 30.0  # how long a node's launcher has to pick a session up
MAX_INPUT = 1 << 20
MAX_BACKLOG = 4 << 20  # bytes a slow node or client may have waiting before the other waits
MAX_ARGV = 4096


class Gone(NotFound):
    """The session has ended (its client left): the node stops its command."""

    code = "gone"
    http_status = 410


@dataclass
class ExecSession:
    ident: str
    argv: list[str]
    tty: bool
    who: str
    node_name: str
    node_rank: int
    job_id: int | None = None
    attempt_uuid: str | None = None
    agent_node_id: int | None = None  # a machine's session: its agent runs it
    inputs: list[dict[str, Any]] = field(default_factory=list)  # not yet taken by the node
    in_seq: int = 0  # the last input's sequence number
    outputs: list[tuple[str, bytes]] = field(default_factory=list)
    out_seq: int = 0
    started: bool = False
    exit_code: int | None = None
    error: str | None = None
    closed: bool = False  # the client has gone (or the session was failed here)
    created: float = field(default_factory=time.monotonic)
    lock: threading.Condition = field(default_factory=threading.Condition)

    @property
    def key_in(self) -> str:
        return f"exec-in:{self.ident}"

    @property
    def key_out(self) -> str:
        return f"exec-out:{self.ident}"

    @property
    def done(self) -> bool:
        return self.exit_code is not None

    def command_text(self) -> str:
        return shlex.join(self.argv) if self.argv else "an interactive shell"

    # --- the client's side ------------------------------------------------------------------

    def push(self, item: dict[str, Any]) -> None:
        with self.lock:
            self.in_seq += 1
            item["seq"] = self.in_seq
            self.inputs.append(item)
            self.lock.notify_all()
        notify.bump(self.key_in)

    def take_output(self) -> list[tuple[str, bytes]]:
        with self.lock:
            out, self.outputs = self.outputs, []
        return out

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        notify.bump(self.key_in)

    def fail(self, message: str, code: int = 255) -> None:
        with self.lock:
            if self.exit_code is None:
                self.error, self.exit_code = message, code
        notify.bump(self.key_out)
        self.close()

    # --- the node's side --------------------------------------------------------------------

    def node_out(self, seq: int, body: dict[str, Any]) -> None:
        """Applied once, in order: a resend (seq already taken) changes nothing."""
        import base64

        with self.lock:
            if seq <= self.out_seq:
                return
            if seq != self.out_seq + 1:
                raise Conflict(f"seq: expected {self.out_seq + 1}, got {seq}")
            self.out_seq = seq
            self.started = True
            for stream in ("o", "e"):
                if body.get(stream):
                    self.outputs.append((stream, base64.b64decode(body[stream])))
            if body.get("error"):
                self.error = str(body["error"])
            if body.get("exit_code") is not None and self.exit_code is None:
                self.exit_code = int(body["exit_code"])
        notify.bump(self.key_out)

    def _after(self, after: int) -> list[dict[str, Any]]:
        """The inputs after ``after``; the ones up to it are taken: kept no longer."""
        self.inputs = [i for i in self.inputs if i["seq"] > after]
        return list(self.inputs)

    def inputs_after(self, after: int) -> tuple[list[dict[str, Any]], bool]:
        with self.lock:
            return self._after(after), self.closed or self.done

    def backlog(self) -> tuple[int, int]:
        """Bytes waiting to go down to the node and up to the client (back pressure)."""
        with self.lock:
            return (sum(len(i.get("data") or "") for i in self.inputs),
                    sum(len(data) for _s, data in self.outputs))

    def wait_input(self, after: int, timeout: float) -> tuple[list[dict[str, Any]], bool]:
        """For a runner thread on this machine (``cluster node exec -it`` on a local node)."""
        with self.lock:
            self.lock.wait_for(lambda: self.in_seq > after or self.closed, timeout)
            return self._after(after), self.closed


_sessions: dict[str, ExecSession] = {}
_lock = threading.Lock()


def new_ident() -> str:
    """Unguessable, and naming this server process (``server.workers`` forwards a node's
    calls here from the others)."""
    return workers.session_tag() + uuid.uuid4().hex[:16]


def _register(sess: ExecSession) -> ExecSession:
    with _lock:
        _sessions[sess.ident] = sess
    return sess


def for_node(ident: str, attempt_uuid: str, node_rank: int) -> ExecSession:
    with _lock:
        sess = _sessions.get(ident)
    if sess is None or sess.attempt_uuid != attempt_uuid or sess.node_rank != node_rank:
        raise NotFound(f"exec session {ident!r} not found for this node")
    return sess


def for_agent(ident: str, node_id: int) -> ExecSession:
    with _lock:
        sess = _sessions.get(ident)
    if sess is None or sess.agent_node_id is None or sess.agent_node_id != node_id:
        raise NotFound(f"exec session {ident!r} not found for this node")
    return sess


def _check_argv(argv: list[str]) -> None:
    if len(argv) > MAX_ARGV or any("\x00" in a for a in argv):
        raise SpecError("command: at most 4096 arguments, without NUL bytes")


def _who(principal: Principal, user: str | None) -> str:
    who = f"job {principal.job_id}'s token" if principal.kind == "job" else (
        f"{principal.name} ({principal.credential})" if principal.name else "the admin token")
    user = (user or "").strip()[:64]
    return f"{user} ({who})" if user else who


# --- a job's session ------------------------------------------------------------------------

def open_job(ctx: ServerContext, principal: Principal, workspace: str, experiment: str,
             name: str, node: int, argv: list[str], tty: bool, size: tuple[int, int],
             term: str, user: str | None) -> ExecSession:
    """A session on node ``node`` of job ``name``'s current attempt, handed to its launcher.
    The job must be running, or failed with its nodes held for exec."""
    from batchyard.server.services import jobs

    _check_argv(argv)
    with channel.control_session(ctx.db) as s:
        job = jobs.find(s, workspace, experiment, name)
        if principal.kind == "job" and principal.job_id != job.id:
            raise Forbidden("a job token may exec only into its own job")
        attempt = s.scalars(select(Attempt).where(Attempt.job_id == job.id)
                            .order_by(Attempt.number.desc())).first()
        held = keepalive.held_until(attempt) is not None
        if attempt is None or not (held or (job.state == "running"
                                            and attempt.state == "running")):
            raise Conflict(f"job {name!r} is {job.state}: job exec needs a running job (or a "
                           "failed one whose nodes limits.keep_alive_on_failure still holds)")
        count = len(attempt.node_ids)
        if not 0 <= node < count:
            raise SpecError(f"--node {node}: job {name!r} has node ranks 0..{count - 1}")
        report = s.scalar(select(NodeReport).where(NodeReport.attempt_id == attempt.id,
                                                   NodeReport.node_rank == node))
        if report is not None and report.state in LAUNCHER_TERMINAL and not (
                held and (report.data or {}).get("held_until")):
            raise Conflict(f"--node {node}: its launcher has ended ({report.state}) and "
                           "keeps nothing for exec there")
        node_row = s.get(Node, attempt.node_ids[node])
        sess = ExecSession(ident=new_ident(), argv=argv, tty=tty,
                           who=_who(principal, user), node_rank=node,
                           node_name=node_row.name if node_row else f"node {node}",
                           job_id=job.id, attempt_uuid=attempt.uuid)
        control = dict(attempt.control or {})
        sessions = {k: list(v) for k, v in (control.get("sessions") or {}).items()}
        sessions.setdefault(str(node), []).append(
            {"id": sess.ident, "argv": argv, "tty": tty, "rows": size[0], "cols": size[1],
             "term": term})
        control["sessions"] = sessions
        channel.set_control(attempt, control)
        common.record(s, "job", job.id, job.state, job.state,
                      f"exec on node {sess.node_name} (rank {node}) by {sess.who}: "
                      f"{sess.command_text()}{' (tty)' if tty else ''}")
    return _register(sess)


def end(ctx: ServerContext, sess: ExecSession) -> None:
    """The session is over: off its attempt's control, its exit in the job's events."""
    sess.close()
    with _lock:
        _sessions.pop(sess.ident, None)
    if sess.job_id is None or sess.attempt_uuid is None:
        return
    with channel.control_session(ctx.db) as s:
        attempt = s.scalar(select(Attempt).where(Attempt.uuid == sess.attempt_uuid))
        if attempt is not None:
            control = dict(attempt.control or {})
            sessions = {k: [r for r in v if r.get("id") != sess.ident]
                        for k, v in (control.get("sessions") or {}).items()}
            control["sessions"] = {k: v for k, v in sessions.items() if v}
            channel.set_control(attempt, control)
        job = s.get(Job, sess.job_id)
        if job is not None:
            how = (f"exit code {sess.exit_code}" if sess.exit_code is not None
                   else "the client left before it ended")
            common.record(s, "job", job.id, job.state, job.state,
                          f"exec on node {sess.node_name} by {sess.who} ended: {how}"
                          + (f" ({sess.error})" if sess.error else ""))


def still_served(ctx: ServerContext, sess: ExecSession) -> str | None:
    """Why the node can no longer answer (None while it can): a launcher that ended without
    keep-alive, a lost node, a released hold, a launcher that never picked it up."""
    if not sess.started and time.monotonic() - sess.created > START_DEADLINE:
        return (f"node {sess.node_name}'s launcher did not pick the session up within "
                f"{START_DEADLINE:g}s")
    if sess.agent_node_id is not None:
        with ctx.db.session() as s:
            node = s.get(Node, sess.agent_node_id)
            if node is None or node.state == "lost":
                return f"node {sess.node_name}'s agent was lost"
    if sess.attempt_uuid is None:
        return None
    with ctx.db.session() as s:
        attempt = s.scalar(select(Attempt).where(Attempt.uuid == sess.attempt_uuid))
        if attempt is None:
            return "the job's attempt is gone"
        report = s.scalar(select(NodeReport).where(NodeReport.attempt_id == attempt.id,
                                                   NodeReport.node_rank == sess.node_rank))
        held = keepalive.held_until(attempt) is not None
        if report is not None and report.state == "lost":
            return f"node {sess.node_name}'s launcher was lost"
        if report is not None and report.state in LAUNCHER_TERMINAL and not held \
                and not (report.data or {}).get("held_until"):
            return f"node {sess.node_name}'s launcher has ended ({report.state})"
        if (attempt.handle or {}).get("released_at") is not None:
            return f"node {sess.node_name} was released (keep-alive over)"
    return None


# --- a local cluster's node (cluster node exec -it) ---------------------------------------

def open_node(ctx: ServerContext, principal: Principal, workspace: str, cluster: str,
              node_name: str, argv: list[str], tty: bool, size: tuple[int, int], term: str,
              user: str | None) -> ExecSession:
    from batchyard.server.services.clusters import _node

    _check_argv(argv)
    if not principal.admin:
        raise Forbidden("cluster node exec needs the admin token")
    with ctx.db.session() as s:
        ws = common.workspace(s, workspace)
        c = common.cluster(s, ws, cluster)
        node = _node(s, c, node_name)
        if c.backend not in ("local", "machines"):
            raise Unsupported(f"cluster node exec -it on a {c.backend} cluster: its nodes are "
                              "its scheduler's; run it in a job there: `batchyard job exec "
                              "-it -n JOB --node N`")
        if node.state == "lost":
            raise Conflict(f"node {node_name!r} is lost (no heartbeat from its agent)")
        sess = _register(ExecSession(ident=new_ident(), argv=argv, tty=tty,
                                     who=_who(principal, user), node_name=node_name,
                                     node_rank=0))
        if c.backend == "machines":  # its agent runs it, asked with its next heartbeat
            sess.agent_node_id = node.id
            s.add(NodeCommand(node_id=node.id, kind="session", created_at=now(), payload={
                "id": sess.ident, "argv": argv, "tty": tty, "rows": size[0], "cols": size[1],
                "term": term}))
        directory = str(node.directory or "")
    if sess.agent_node_id is not None:
        notify.bump(f"node:{sess.agent_node_id}")  # its agent may be waiting in a heartbeat
    else:
        from batchyard.backends.local import run_node_session

        threading.Thread(target=run_node_session, args=(sess, directory, size, term),
                         daemon=True, name=f"exec-{sess.ident}").start()
    return sess


def decode_size(rows: Any, cols: Any) -> tuple[int, int]:
    try:
        size = (int(rows), int(cols))
    except (TypeError, ValueError):
        raise SpecError("rows, cols: whole numbers (the terminal's size)") from None
    if not (1 <= size[0] <= 1000 and 1 <= size[1] <= 1000):
        raise SpecError("rows, cols: between 1 and 1000")
    return size

