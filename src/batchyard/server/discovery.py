"""Clusters whose nodes are discovered (Ray): keep the node rows in sync with what the backend
sees — new nodes join idle, nodes that left are marked leaving (their job is stopped with the
node named) — and ask the backend's autoscaler for what queued gangs need."""

from __future__ import annotations

import logging
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.backends import get_backend
from batchyard.backends.base import (
    NodeInfo,
    SupportsDiscovery,
    SupportsJoin,
    has_queue,
    implements,
)
from batchyard.server.services import common
from batchyard.server.services.interrupts import interrupt
from batchyard.states import NODE_GONE
from batchyard.store.models import Cluster, Job, Node, Workspace

log = logging.getLogger("batchyard.discovery")
GONE = NODE_GONE


def is_discovered(cluster: Cluster) -> bool:
    """Nodes that come by themselves: Ray's, and machines that join with `batchyard agent`
    (neither is provisioned nor scaled by batchyard)."""
    backend = get_backend(cluster.backend)
    return implements(backend, SupportsDiscovery) or implements(backend, SupportsJoin)


def sync(session: Session, cluster: Cluster, stamp: float | None = None) -> None:
    backend = get_backend(cluster.backend)
    if isinstance(backend, SupportsJoin):
        from batchyard.server.services.agents import check_heartbeats

        check_heartbeats(session, cluster, time.time() if stamp is None else stamp)
        return
    if not isinstance(backend, SupportsDiscovery):
        return
    stamp = time.time() if stamp is None else stamp
    ws = session.get(Workspace, cluster.workspace_id)
    assert ws is not None
    found = backend.discover(cluster.name, ws.name, dict(cluster.spec))
    what = "the Slurm partition" if cluster.backend == "slurm" else "the Ray cluster"
    rows = list(session.scalars(select(Node).where(Node.cluster_id == cluster.id)))
    by_name = {n.name: n for n in rows}
    used = {n.index for n in rows}
    index = 0
    for info in found:
        if info.name in by_name:
            _follow_state(session, by_name[info.name], info)
            continue
        while index in used:
            index += 1
        used.add(index)
        state = "unusable" if info.unusable else "idle"
        node = Node(cluster_id=cluster.id, name=info.name, index=index, address=info.address,
                    state=state, resources=info.resources, directory=info.directory,
                    ready_at=stamp, idle_since=stamp, reason=info.unusable)
        session.add(node)
        session.flush()
        common.record(session, "node", node.id, None, state, info.unusable or f"joined {what}")
    seen = {i.name for i in found}
    for node in rows:
        if node.name in seen or node.state in GONE:
            continue
        previous, node.state = node.state, "leaving"
        node.reason = ("left the Slurm partition" if cluster.backend == "slurm"
                       else "left the Ray cluster (its raylet stopped or died)")
        common.record(session, "node", node.id, previous, "leaving", node.reason)
        if node.job_id is not None:
            interrupt(session, node.job_id, "lost", f"node {node.name} left {what}", 3.0)
    cluster.target_nodes = len(found)
    _ask_autoscaler(session, cluster, backend, len(found))


def _follow_state(session: Session, node: Node, info: NodeInfo) -> None:
    """A node the backend reports unusable (a drained or down Slurm node) becomes unusable
    with the backend's reason, and idle again when it returns; a bound node keeps its job
    (the job's own backend state says what became of it)."""
    if info.address and node.address != info.address:
        node.address = info.address
    if info.unusable and node.state in ("idle", "running") and node.job_id is None:
        previous, node.state, node.reason = node.state, "unusable", info.unusable
        common.record(session, "node", node.id, previous, "unusable", info.unusable)
    elif info.unusable and node.state == "unusable" and node.reason != info.unusable:
        node.reason = info.unusable
    elif not info.unusable and node.state == "unusable" and node.job_id is None \
            and not (node.reason or "").startswith("pre-flight"):  # ours: `cluster node enable`
        node.state, node.reason, node.idle_since = "idle", None, time.time()
        common.record(session, "node", node.id, "unusable", "idle", "usable again")


def _ask_autoscaler(session: Session, cluster: Cluster, backend: SupportsDiscovery,
                    have: int) -> None:
    """Queued gangs larger than the cluster ask Ray's autoscaler for their bundles, within
    the cluster's max_nodes when it autoscales (best effort)."""
    queued = session.scalars(select(Job).where(Job.cluster_id == cluster.id,
                                               Job.state == "queued"))
    wanted = max((int(j.spec.get("nodes", 1)) for j in queued), default=0)
    auto = cluster.spec.get("autoscale") or {}
    if auto:
        wanted = min(max(wanted, int(auto.get("min_nodes", 0))), int(auto["max_nodes"]))
    if wanted <= have or has_queue(backend):
        return
    bundle = {"CPU": float(cluster.size.get("vcpus") or 1), f"batchyard/{cluster.name}": 1.0}
    try:
        backend.request_resources(dict(cluster.spec), [bundle] * wanted)
    except Exception as exc:  # an autoscaler is optional
        log.debug("request_resources failed: %s", exc)
