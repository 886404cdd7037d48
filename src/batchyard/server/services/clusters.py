"""Clusters and their nodes. Provisioning goes through the cluster's backend; nodes are rows
whose state the reconciler and the scheduler read."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from batchyard.backends import get_backend
from batchyard.backends.base import NodeInfo, SplitsHostGpus, SupportsSetupTask
from batchyard.errors import Conflict, NoCapacity, NotFound, SpecError
from batchyard.server.context import kick_after_commit
from batchyard.server.services import common, quotas
from batchyard.spec.cluster import ClusterSpec
from batchyard.states import JOB_ACTIVE, NODE_GONE
from batchyard.store.models import Cluster, Job, Node

ACTIVE = JOB_ACTIVE


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
    backend = get_backend(spec.backend)  # unknown or unavailable: fails here, before any row
    size = spec.node_size()
    if spec.backend == "slurm":
        size = _slurm_size(backend, spec, ws.name)
    quotas.check_allocation(session, ws.id, size.to_dict(), spec.initial_nodes,
                            f"cluster {spec.name!r}")
    _check_gpus(backend, size.to_dict(), spec.initial_nodes, "vm_size")
    c = Cluster(workspace_id=ws.id, name=spec.name, backend=spec.backend,
                spec=spec.model_dump(mode="json"), size=size.to_dict(), state="steady",
                target_nodes=spec.initial_nodes)
    session.add(c)
    session.flush()
    common.record(session, "cluster", c.id, None, "steady", f"created on {spec.backend}")
    from batchyard.server import discovery

    if discovery.is_discovered(c):  # Ray: the nodes are whatever carries the cluster's resource
        discovery.sync(session, c)
    else:
        add_nodes(session, c, spec.initial_nodes, ws.name)
    data = common.cluster_dict(session, c, with_nodes=True)
    warnings = _size_warnings(spec, size.to_dict())
    if warnings:
        data["warnings"] = warnings
    return data


def _check_gpus(backend: Any, size: dict[str, Any], count: int, field: str) -> None:
    """Nodes that are slices of this machine need GPUs of their own: refuse a size (or a
    resize) that needs more than the machine has left."""
    if count > 0 and isinstance(backend, SplitsHostGpus):
        why = backend.gpu_shortfall(size, count)
        if why:
            raise NoCapacity(f"{field}: {why}", details=[{"field": field, "message": why}])


def _size_warnings(spec: ClusterSpec, size: dict[str, Any]) -> list[str]:
    """A GPU size on a host without GPUs makes nodes that offer none: a job asking for GPUs
    would then be refused, or a CPU-only run taken for a GPU one."""
    wanted = int(size.get("gpus") or 0)
    if spec.backend != "local" or not wanted:
        return []
    from batchyard.backends.local import host_gpus

    if host_gpus():
        return []
    label = spec.vm_size or "this size"
    return [f"warning: {label} has {wanted} GPU(s) per node, but this machine has no GPU: "
            "the nodes will offer 0 GPUs"]


def _slurm_size(backend: Any, spec: ClusterSpec, workspace: str) -> Any:
    """The partition must exist and have nodes; without a size, a node is the partition's
    smallest (its CPUs and GPUs become --cpus-per-task and --gres)."""
    from batchyard.backends import slurm_cli
    from batchyard.spec.sizes import custom

    partition = spec.slurm.partition if spec.slurm else None
    if partition:
        known = slurm_cli.partitions()
        if partition not in known:
            raise SpecError(f"slurm.partition: Slurm has no partition {partition!r}; it has: "
                            f"{', '.join(known) or 'none'}")
    found = backend.discover(spec.name, workspace, spec.model_dump(mode="json"))
    if not found:
        raise SpecError(f"slurm.partition: partition {partition or '(default)'} has no nodes")
    if spec.vm_size or spec.resources:
        return spec.node_size()
    return custom(min(int(n.resources["cpus"]) for n in found),
                  min(int(n.resources["gpus"]) for n in found),
                  min(float(n.resources["memory_gb"]) for n in found) or 1.0)


def _refuse_on_slurm(c: Cluster, what: str) -> None:
    if c.backend == "slurm":
        raise Conflict(f"cluster {c.name!r} runs on Slurm, which owns its nodes: {what} is "
                       "Slurm's business (its nodes are the partition's)")


def add_nodes(session: Session, c: Cluster, count: int, workspace: str,
              stamp: float | None = None) -> None:
    """New nodes join as `preparing`: after the provisioning delay and the setup task (if
    any) the reconciler makes them idle."""
    backend = get_backend(c.backend)
    used = {n.index for n in session.scalars(select(Node).where(Node.cluster_id == c.id))}
    stamp = time.time() if stamp is None else stamp
    delay = float(c.spec.get("provisioning_delay") or 0.0)
    instant = delay == 0 and not c.spec.get("setup_task")
    index = 0
    added: list[tuple[NodeInfo, Node]] = []
    try:
        for _ in range(count):
            while index in used:
                index += 1
            used.add(index)
            info = backend.provision_node(c.name, workspace, index, c.size)
            row = Node(cluster_id=c.id, name=info.name, index=info.index,
                       address=info.address, state="idle" if instant else "preparing",
                       resources=info.resources, directory=info.directory,
                       ready_at=stamp + delay, idle_since=stamp if instant else None)
            session.add(row)
            added.append((info, row))
    except NoCapacity:  # all or none: give back what the others took (their GPUs)
        for info, row in added:
            backend.remove_node(info)
            session.expunge(row)
        raise
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
    """Set a manual cluster's target; the reconciler adds or removes nodes (running ones per
    the cluster's node_deallocation_option)."""
    if target < 0:
        raise SpecError("target: must be 0 or more")
    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    _refuse_on_slurm(c, "resizing")
    spec = dict(c.spec)
    if spec.get("autoscale"):
        raise Conflict(f"cluster {name!r} autoscales; change its min/max with "
                       "`cluster auto-scale` instead of resizing")
    active = session.scalar(select(func.count(Node.id)).where(
        Node.cluster_id == c.id, Node.state.not_in(NODE_GONE))) or 0
    _check_gpus(get_backend(c.backend), c.size, target - active, "target")
    spec["manual"] = {**(spec.get("manual") or {}), "target_node_count": target}
    c.spec = spec
    common.record(session, "cluster", c.id, str(c.target_nodes), str(target), "resize")
    c.target_nodes = target
    c.state = "resizing"
    kick_after_commit(session)
    return common.cluster_dict(session, c, with_nodes=True)


def auto_scale(session: Session, workspace: str, name: str, min_nodes: int, max_nodes: int,
               idle_seconds: float | None = None) -> dict[str, Any]:
    """Switch a cluster to autoscale (or change its bounds), as `az batchai cluster
    auto-scale` does."""
    if min_nodes < 0 or max_nodes < 1 or min_nodes > max_nodes:
        raise SpecError("min/max: need 0 <= min <= max and max >= 1")
    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    _refuse_on_slurm(c, "autoscale")
    spec = dict(c.spec)
    old = spec.get("autoscale") or {}
    spec["autoscale"] = {**old, "min_nodes": min_nodes, "max_nodes": max_nodes}
    spec["autoscale"].setdefault("initial_node_count", 0)
    if idle_seconds is not None:
        spec["autoscale"]["idle_seconds_before_scaledown"] = idle_seconds
    spec["autoscale"].setdefault("idle_seconds_before_scaledown", 1800)
    spec["manual"] = None
    c.spec = spec
    c.target_nodes = min(max(c.target_nodes, min_nodes), max_nodes)
    common.record(session, "cluster", c.id, None, None, f"autoscale {min_nodes}..{max_nodes}")
    kick_after_commit(session)
    return common.cluster_dict(session, c, with_nodes=True)


def preempt_node(session: Session, workspace: str, name: str, node_name: str) -> dict[str, Any]:
    from batchyard.server.nodes import preempt

    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    if c.spec.get("vm_priority") != "lowpriority":
        raise Conflict(f"cluster {name!r} is dedicated: only low-priority nodes are preempted "
                       "(use resize to remove a node)")
    node = _node(session, c, node_name)
    if node.state in ("preempted", "leaving"):
        raise Conflict(f"node {node_name!r} is already {node.state}")
    preempt(session, c, node, "preempted (low-priority eviction requested)")
    kick_after_commit(session)
    return common.node_dict(node)


def enable_node(session: Session, workspace: str, name: str, node_name: str) -> dict[str, Any]:
    """An admin's word that an unusable node (a failed pre-flight or setup task) is fixed:
    it is idle again and the scheduler may place jobs on it."""
    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    node = _node(session, c, node_name)
    if node.state != "unusable":
        raise Conflict(f"node {node_name!r} is {node.state}, not unusable")
    common.record(session, "node", node.id, "unusable", "idle",
                  f"enabled by an admin (was: {node.reason})")
    from batchyard.server.services.health import enabled

    enabled(node)
    node.state, node.reason, node.idle_since = "idle", None, time.time()
    kick_after_commit(session)
    return common.node_dict(node)


def _node(session: Session, c: Cluster, node_name: str) -> Node:
    node = session.scalar(select(Node).where(Node.cluster_id == c.id, Node.name == node_name))
    if node is None:
        raise NotFound(f"node {node_name!r} not found in cluster {c.name!r}")
    return node


def setup_files(session: Session, workspace: str, name: str) -> list[dict[str, Any]]:
    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    backend = get_backend(c.backend)
    out: list[dict[str, Any]] = []
    if not isinstance(backend, SupportsSetupTask):
        return out
    for node in session.scalars(select(Node).where(Node.cluster_id == c.id)
                                .order_by(Node.index)):
        for rel, content in backend.setup_files(node_info(node)):
            out.append({"path": rel, "node": node.name, "size": len(content)})
    return out


def setup_file(session: Session, workspace: str, name: str, rel: str) -> bytes:
    """The content the node sent: a node's paths mean nothing on the server."""
    ws = common.workspace(session, workspace)
    c = common.cluster(session, ws, name)
    backend = get_backend(c.backend)
    if isinstance(backend, SupportsSetupTask):
        for node in session.scalars(select(Node).where(Node.cluster_id == c.id)):
            for known, content in backend.setup_files(node_info(node)):
                if known == rel:
                    return content
    raise NotFound(f"file {rel!r} not found in cluster {name!r}")


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
    from sqlalchemy import delete as drop

    from batchyard.store.identity import Guarantee  # teams' guarantees go with the cluster

    session.execute(drop(Guarantee).where(Guarantee.cluster_id == c.id))
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
    node = _node(session, c, node_name)
    code, out, err = get_backend(c.backend).exec(node_info(node), argv, timeout)
    return {"node": node.name, "exit_code": code, "stdout": out, "stderr": err}
