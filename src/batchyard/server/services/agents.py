"""Machines joined by `batchyard agent`: join tokens (cluster-scoped, hashed, expiring,
revocable), node credentials (one per machine, acting for that node only), heartbeats, lost
nodes, and the commands an agent takes with its heartbeat (exec).

An agent is told what to run rather than sent launch requests: each heartbeat answers the
(attempt, node rank) pairs its node has in active attempts, so a restarted agent, a
restarted server or a healed partition converge on the same truth without replays."""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.backends.base import NodeInfo
from batchyard.errors import AuthError, Forbidden, NotFound, SpecError
from batchyard.launchplan import container_report, node_attempt_dir
from batchyard.server import notify
from batchyard.server.context import ServerContext
from batchyard.server.services import common, health, keepalive
from batchyard.server.services.channel import (
    NODE_TERMINAL,
    launch_token,
)
from batchyard.server.services.gpu_usage import machine_sample
from batchyard.server.services.interrupts import ACTIVE_ATTEMPT, interrupt
from batchyard.store.db import Database
from batchyard.store.models import (
    Attempt,
    Cluster,
    Experiment,
    Job,
    JoinToken,
    Node,
    NodeCommand,
    NodeReport,
    Workspace,
    now,
)

DEFAULT_TTL = 24 * 3600.0
HEARTBEAT_FRACTION = 6  # heartbeats per timeout
REDELIVER_AFTER = 30.0
# Silence counts only from when this server process could hear it: a server down (killed,
# restarted) for longer than the heartbeat timeout must not find every node lost at start.
WATCHING_SINCE = time.time()


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _machines_cluster(session: Session, workspace: str, name: str) -> Cluster:
    c = common.cluster(session, common.workspace(session, workspace), name)
    if c.backend != "machines":
        raise SpecError(f"cluster {name!r} is a {c.backend} cluster; join tokens are for "
                        "clusters created with --backend machines")
    return c


# --- join tokens --------------------------------------------------------------------------

def create_join_token(session: Session, workspace: str, cluster: str,
                      ttl: float | None) -> dict[str, Any]:
    c = _machines_cluster(session, workspace, cluster)
    ttl = DEFAULT_TTL if ttl is None else ttl
    if not 60 <= ttl <= 365 * 24 * 3600:
        raise SpecError("ttl: between 60 seconds and 365 days")
    token = "join." + secrets.token_urlsafe(24)
    row = JoinToken(cluster_id=c.id, token_hash=_hash(token), prefix=token[5:13],
                    created_at=now(), expires_at=now() + ttl)
    session.add(row)
    session.flush()
    return {"token": token, "prefix": row.prefix, "expires_at": row.expires_at,
            "cluster": c.name}


def list_join_tokens(session: Session, workspace: str, cluster: str) -> list[dict[str, Any]]:
    c = _machines_cluster(session, workspace, cluster)
    rows = session.scalars(select(JoinToken).where(JoinToken.cluster_id == c.id)
                           .order_by(JoinToken.id))
    return [{"prefix": r.prefix, "created_at": r.created_at, "expires_at": r.expires_at,
             "revoked": r.revoked_at is not None,
             "expired": (r.expires_at or 0) < now()} for r in rows]


def revoke_join_tokens(session: Session, workspace: str, cluster: str,
                       prefix: str | None) -> dict[str, Any]:
    c = _machines_cluster(session, workspace, cluster)
    query = select(JoinToken).where(JoinToken.cluster_id == c.id,
                                    JoinToken.revoked_at.is_(None))
    if prefix:
        query = query.where(JoinToken.prefix == prefix.removeprefix("join.")[:8])
    rows = list(session.scalars(query))
    if prefix and not rows:
        raise NotFound(f"no active join token {prefix!r} in cluster {cluster!r}")
    for row in rows:
        row.revoked_at = now()
    return {"revoked": len(rows)}


# --- join and credentials -----------------------------------------------------------------

def join(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    """Join token -> this machine's own node credential. Idempotent per machine id: a machine
    that joins again keeps its node (and gets a fresh credential)."""
    token = str(body.get("join_token") or "")
    row = session.scalar(select(JoinToken).where(JoinToken.token_hash == _hash(token)))
    if row is None or row.revoked_at is not None or (row.expires_at or 0) < now():
        raise AuthError("invalid, expired or revoked join token")
    cluster = session.get(Cluster, row.cluster_id)
    if cluster is None or cluster.deleting:
        raise AuthError("the join token's cluster no longer exists")
    machine_id = str(body["machine_id"])
    node = session.scalar(select(Node).where(Node.cluster_id == cluster.id,
                                             Node.machine_id == machine_id))
    credential = "node." + secrets.token_urlsafe(32)
    resources = dict(body.get("resources") or {})
    if node is None:
        taken = {n.name for n in session.scalars(select(Node).where(
            Node.cluster_id == cluster.id))}
        used = {n.index for n in session.scalars(select(Node).where(
            Node.cluster_id == cluster.id))}
        name = common.check_name("name", str(body.get("name") or body.get("hostname")
                                             or "node"))
        base, suffix = name, 2
        while name in taken:
            name, suffix = f"{base}-{suffix}", suffix + 1
        index = 0
        while index in used:
            index += 1
        node = Node(cluster_id=cluster.id, name=name, index=index, state="idle",
                    address=str(body["address"]), resources=resources,
                    directory=str(body["work_dir"]), ready_at=now(), idle_since=now(),
                    machine_id=machine_id)
        session.add(node)
        session.flush()
        common.record(session, "node", node.id, None, "idle",
                      f"machine {body.get('hostname')} joined at {node.address}")
    else:
        node.address = str(body["address"])
        node.resources = resources
        node.directory = str(body["work_dir"])
    node.credential_hash = _hash(credential)
    node.heartbeat_at = now()
    cluster.target_nodes = len(list(session.scalars(select(Node.id).where(
        Node.cluster_id == cluster.id))))
    timeout = float(cluster.spec.get("heartbeat_timeout") or 30.0)
    return {"node": node.name, "cluster": cluster.name, "credential": credential,
            "heartbeat_timeout": timeout,
            "heartbeat_interval": min(2.0, max(0.5, timeout / HEARTBEAT_FRACTION))}


def node_for(session: Session, token: str, node_name: str) -> Node:
    """401 for no valid node credential; 403 for a valid one acting for another node."""
    if not token.startswith("node."):
        raise AuthError("not a node credential")
    node = session.scalar(select(Node).where(Node.credential_hash == _hash(token)))
    if node is None:
        raise AuthError("invalid node credential (the node left or joined again)")
    if node.name != node_name:
        raise Forbidden("a node credential acts only for its own node")
    return node


# --- heartbeats ---------------------------------------------------------------------------

def heartbeat(ctx: ServerContext, session: Session, node: Node,
              body: dict[str, Any]) -> dict[str, Any]:
    stamp = now()
    node.heartbeat_at = stamp
    sample = machine_sample(body.get("usage"))
    if sample is not None:  # the machine's CPU, memory and GPUs (/metrics)
        node.usage = sample
    found = body.get("containers")
    if isinstance(found, dict):  # {}: it has no runtime (an older agent sends nothing)
        view = container_report(found)
        if (node.resources or {}).get("containers") != view:
            node.resources = {**(node.resources or {}), "containers": view}
    cluster = session.get(Cluster, node.cluster_id)
    assert cluster is not None
    launchers = list(body.get("launchers") or [])
    wanted = _wanted(ctx, session, node)
    wanted_keys = {(w["attempt"], w["node_rank"]) for w in wanted}
    for launcher in launchers:
        key = (str(launcher.get("attempt")), int(launcher.get("node_rank", -1)))
        if not launcher.get("alive") and key in wanted_keys:
            _mark_lost(session, key[0], key[1], f"node launcher on {node.name} died")
    if node.state == "lost":
        if not any(launcher.get("alive") for launcher in launchers):
            node.state, node.reason = "idle", None
            node.idle_since = stamp
            common.record(session, "node", node.id, "lost", "idle",
                          "its agent is back and swept the old attempts")
        wanted = []
    # Each command once, and again only if its result is long overdue (an agent restarted
    # while running it); the agent ignores an id it has seen.
    commands = [c for c in session.scalars(select(NodeCommand).where(
        NodeCommand.node_id == node.id, NodeCommand.done_at.is_(None))
        .order_by(NodeCommand.id))
        if c.taken_at is None or stamp - c.taken_at > REDELIVER_AFTER + float(
            (c.payload or {}).get("timeout") or 0)]
    for command in commands:
        command.taken_at = stamp
    timeout = float(cluster.spec.get("heartbeat_timeout") or 30.0)
    reply = _health(session, cluster, node, body.get("health"), stamp,
                    bool(body.get("checking")))
    return {**reply, "node": node.name, "state": node.state, "run": wanted,
            "commands": [{"id": c.id, "kind": c.kind, "payload": c.payload} for c in commands],
            "heartbeat_timeout": timeout,
            "heartbeat_interval": min(2.0, max(0.5, timeout / HEARTBEAT_FRACTION)),
            "removed": node.state in ("leaving",) and node.job_id is None}


def _health(session: Session, cluster: Cluster, node: Node, result: Any,
            stamp: float, checking: bool = False) -> dict[str, Any]:
    """A health check the agent finished is applied; a due one is asked for, with the GPUs
    the node was given (server/services/health.py)."""
    if isinstance(result, dict) and health.every(cluster) is not None:
        health.apply(session, cluster, node, result)
    if checking or not health.due(cluster, node, stamp):
        return {}
    return {"health_check": {"gpu_ids": list((node.resources or {}).get("gpu_ids") or [])}}


def _wanted(ctx: ServerContext, session: Session, node: Node) -> list[dict[str, Any]]:
    out = []
    # Every heartbeat looks at every active attempt: as (id, nodes) rows, not whole objects,
    # of which a busy fleet's heartbeats built thousands a second (bench/fleet_sim.py)
    mine = [aid for aid, ids in session.execute(select(Attempt.id, Attempt.node_ids).where(
        Attempt.state.in_(ACTIVE_ATTEMPT), Attempt.handle.is_not(None))) if node.id in (ids or ())]
    attempts = [a for a in (session.get(Attempt, aid) for aid in mine) if a is not None]
    held = keepalive.held_attempt_of(session, node)  # a failed gang kept for job exec
    for attempt in [*attempts, *([held] if held is not None else [])]:
        if node.id not in attempt.node_ids:
            continue
        rank = list(attempt.node_ids).index(node.id)
        row = session.scalar(select(NodeReport).where(NodeReport.attempt_id == attempt.id,
                                                      NodeReport.node_rank == rank))
        if row is not None and row.state in NODE_TERMINAL and not (
                (row.data or {}).get("held_until") and keepalive.holding(attempt)):
            continue
        job = session.get(Job, attempt.job_id)
        assert job is not None
        ws = session.get(Workspace, job.workspace_id)
        exp = session.get(Experiment, job.experiment_id)
        assert ws is not None and exp is not None
        out.append({"attempt": attempt.uuid, "node_rank": rank,
                    "token": launch_token(ctx, attempt.uuid, rank),
                    "attempt_dir": str(node_attempt_dir(node.directory, ws.name, exp.name,
                                                        job.name, attempt.uuid))})
    return out


def _mark_lost(session: Session, attempt_uuid: str, rank: int, message: str) -> None:
    attempt = session.scalar(select(Attempt).where(Attempt.uuid == attempt_uuid))
    if attempt is None:
        return
    row = session.scalar(select(NodeReport).where(NodeReport.attempt_id == attempt.id,
                                                  NodeReport.node_rank == rank))
    if row is not None and row.state not in NODE_TERMINAL:
        row.state = "lost"
        row.data = {**(row.data or {}), "message": message, "lost_message": message}
        row.updated_at = now()


def check_heartbeats(session: Session, cluster: Cluster, stamp: float) -> None:
    """A node whose agent is silent for the timeout is lost: its share of any attempt is
    lost with it, and the job fails or requeues per its retry policy, naming the node."""
    timeout = float(cluster.spec.get("heartbeat_timeout") or 30.0)
    for node in session.scalars(select(Node).where(Node.cluster_id == cluster.id)):
        if node.state in ("lost", "leaving", "preempted"):
            continue
        if node.heartbeat_at is None or stamp - max(node.heartbeat_at,
                                                    WATCHING_SINCE) <= timeout:
            continue
        previous = node.state
        node.state = "lost"
        node.reason = f"no heartbeat from its agent for {timeout:g}s"
        node.idle_since = None
        common.record(session, "node", node.id, previous, "lost", node.reason)
        if node.job_id is None:
            continue
        message = f"node {node.name} was lost: no heartbeat from its agent for {timeout:g}s"
        for attempt in session.scalars(select(Attempt).where(
                Attempt.job_id == node.job_id, Attempt.state.in_(ACTIVE_ATTEMPT))):
            if node.id in attempt.node_ids:
                _mark_lost(session, attempt.uuid, list(attempt.node_ids).index(node.id),
                           message)
        interrupt(session, node.job_id, "lost", message, 3.0)


# --- commands (exec) ----------------------------------------------------------------------

def complete_command(session: Session, node: Node, command_id: int,
                     result: dict[str, Any]) -> None:
    command = session.get(NodeCommand, command_id)
    if command is None or command.node_id != node.id:
        raise NotFound(f"command {command_id} not found for node {node.name}")
    if command.done_at is None:  # a replayed result changes nothing
        command.done_at = now()
        command.result = result


def exec_hook(db: Database) -> Any:
    """``cluster node exec`` on a machine: queued for its agent, answered by it."""

    def run(node: NodeInfo, argv: list[str], timeout: float) -> tuple[int, str, str]:
        with db.session() as session:
            row = session.scalar(select(Node).where(Node.directory == node.directory,
                                                    Node.name == node.name))
            if row is None:
                raise NotFound(f"node {node.name!r} not found")
            if row.state == "lost":
                return 255, "", f"node {node.name} is lost (no heartbeat from its agent)\n"
            command = NodeCommand(node_id=row.id, kind="exec",
                                  payload={"argv": argv, "timeout": timeout}, created_at=now())
            session.add(command)
            session.flush()
            command_id = command.id
            node_id = row.id
        notify.bump(f"node:{node_id}")  # its agent may be waiting in a heartbeat
        deadline = time.monotonic() + timeout + 30.0
        while time.monotonic() < deadline:
            with db.session() as session:
                done = session.get(NodeCommand, command_id)
                if done is not None and done.done_at is not None:
                    result = done.result or {}
                    return (int(result.get("exit_code", 255)), str(result.get("stdout", "")),
                            str(result.get("stderr", "")))
            time.sleep(0.1)
        return 124, "", f"the agent of {node.name} did not answer in {timeout + 30:g}s\n"

    return run
