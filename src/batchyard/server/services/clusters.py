"""Clusters and their nodes. Provisioning goes through the cluster's backend; nodes are rows
whose state the reconciler and the scheduler read."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.backends import get_backend
from batchyard.backends.base import NodeInfo
from batchyard.errors import Conflict, NotFound, SpecError
from batchyard.server.services import common
from batchyard.spec.cluster import ClusterSpec
from batchyard.store.models import Cluster, Job, Node

ACTIVE = ("queued", "preparing", "running", "finalizing")


def node_info(node: Node) -> NodeInfo:
    return NodeInfo(node.name, node.index, node.address, node.directory, node.resources)


def create(session: Session, workspace: str, spec: ClusterSpec) -> dict[str, Any]:
    ws = common.workspace(session, workspace)
    existing = session.scalar(select(Cluster).where(Cluster.workspace_id == ws.id,
                                                    Cluster.name == spec.name))
    if existing is not None and not existing.deleting:
        raise Conflict(f"cluster {spec.name!r} already exists in workspace {workspace!r}")
    if existing is not None:
        _purge(session, existing)
    backend = get_backend(spec.backend)
    size = spec.node_size()
    c = Cluster(workspace_id=ws.id, name=spec.name, backend=spec.backend,
                spec=spec.model_dump(mode="json"), size=size.to_dict(), state="steady",
                target_nodes=spec.initial_nodes)
    session.add(c)
    session.flush()
    common.record(session, "cluster", c.id, None, "steady", f"created on {spec.backend}")
    _add_nodes(session, c, spec.initial_nodes, ws.name)
    _ = backend
    return common.cluster_dict(session, c, with_nodes=True)


def _add_nodes(session: Session, c: Cluster, count: int, workspace: str) -> None:
    backend = get_backend(c.backend)
    used = {n.index for n in session.scalars(select(Node).where(Node.cluster_id == c.id))}
    index = 0
    stamp = time.time()
    for _ in range(count):
        while index in used:
            index += 1
        used.add(index)
        info = backend.provision_node(c.name, workspace, index, c.size)
        session.add(Node(cluster_id=c.id, name=info.name, index=info.index,
                         address=info.address, state="idle", resources=info.resources,
                         directory=info.directory, ready_at=stamp, idle_since=stamp))
    session.flush()


def list_all(session: Session, workspace: str) -> list[dict[str, Any]]:
    ws = common.workspace(session, workspace)
    clusters = session.scalars(select(Cluster).where(Cluster.workspace_id == ws.id,
                                                     Cluster.deleting.is_(False))
                               .order_by(Cluster.name))
    return [common.cluster_dict(session, c) for c in clusters]


def show(session: Session, workspace: str, name: str) -> dict[str, Any]:
    ws = common.workspace(session, workspace)
    return common.cluster_dict(session, common.cluster(session, ws, name), with_nodes=True)


def resize(session: Session, workspace: str, name: str, target: int) -> dict[str, Any]:
    if target < 0:
        raise SpecError("target: must be 0 or more")
    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    spec = dict(c.spec)
    if spec.get("autoscale"):
        raise Conflict(f"cluster {name!r} autoscales; change its min/max instead of resizing")
    spec["manual"] = {**(spec.get("manual") or {}), "target_node_count": target}
    c.spec = spec
    old = c.target_nodes
    c.target_nodes = target
    nodes = list(session.scalars(select(Node).where(Node.cluster_id == c.id)
                                 .order_by(Node.index.desc())))
    if target > len(nodes):
        _add_nodes(session, c, target - len(nodes), ws.name)
    elif target < len(nodes):
        surplus = len(nodes) - target
        idle = [n for n in nodes if n.job_id is None][:surplus]
        if len(idle) < surplus:
            c.state = "resizing"
        for node in idle:
            get_backend(c.backend).remove_node(node_info(node))
            session.delete(node)
    common.record(session, "cluster", c.id, str(old), str(target), "resize")
    session.flush()
    return common.cluster_dict(session, c, with_nodes=True)


def delete(session: Session, workspace: str, name: str) -> None:
    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    if session.scalar(select(Job.id).where(Job.cluster_id == c.id,
                                           Job.state.in_(ACTIVE)).limit(1)):
        raise Conflict(f"cluster {name!r} has active jobs; terminate them or wait")
    _purge(session, c)


def _purge(session: Session, c: Cluster) -> None:
    backend = get_backend(c.backend)
    for node in session.scalars(select(Node).where(Node.cluster_id == c.id)):
        backend.remove_node(node_info(node))
        session.delete(node)
    has_jobs = session.scalar(select(Job.id).where(Job.cluster_id == c.id).limit(1))
    if has_jobs:
        c.deleting = True
        c.name = f"{c.name}~deleted-{c.id}"
    else:
        session.delete(c)
    session.flush()


def nodes(session: Session, workspace: str, name: str) -> list[dict[str, Any]]:
    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    rows = session.scalars(select(Node).where(Node.cluster_id == c.id).order_by(Node.index))
    return [common.node_dict(n) for n in rows]


def exec_on_node(session: Session, workspace: str, name: str, node_name: str,
                 argv: list[str], timeout: float) -> dict[str, Any]:
    if not argv:
        raise SpecError("argv: give a command to run")
    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    node = session.scalar(select(Node).where(Node.cluster_id == c.id,
                                             Node.name == node_name))
    if node is None:
        raise NotFound(f"node {node_name!r} not found in cluster {name!r}")
    code, out, err = get_backend(c.backend).exec(node_info(node), argv, timeout)
    return {"node": node.name, "exit_code": code, "stdout": out, "stderr": err}
