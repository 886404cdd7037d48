"""Node lifecycle on each reconciler pass: provisioning delay, setup task, scaling to the
cluster's target (and the deallocation option when shrinking), autoscale decisions from the
scheduler, removal of nodes that left, and chaos preemption of low-priority nodes."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.backends import get_backend
from batchyard.backends.base import SupportsSetupTask, checks_health
from batchyard.errors import NoCapacity
from batchyard.scheduler import ClusterView, Plan
from batchyard.server import discovery
from batchyard.server.health_runner import LocalHealth
from batchyard.server.services import common
from batchyard.server.services.clusters import add_nodes, node_info
from batchyard.server.services.interrupts import interrupt
from batchyard.states import NODE_GONE
from batchyard.store.models import Cluster, Node, Workspace, now

log = logging.getLogger("batchyard.scaling")
GONE = NODE_GONE


class NodeManager:
    def __init__(self) -> None:
        self.last_tick = time.time()
        self.rng = random.Random()
        # after a tick: whether some cluster changes by time alone (agents' heartbeats, Ray's
        # nodes, autoscale, chaos preemption), so passes must keep coming without a kick
        self.timed = False
        self.health = LocalHealth()  # the local backend's virtual nodes' health checks

    def tick(self, session: Session, plan: Plan | None, horizon: float = 0.0) -> bool:
        """Whether no node has anything due within ``horizon`` seconds after this pass: none
        leaving, none running a setup task, none ready sooner (a provisioning delay ends
        at a known time), and every cluster at its target."""
        stamp = now()
        settled = True
        elapsed, self.last_tick = stamp - self.last_tick, stamp
        self.timed = False
        if plan is not None:
            self._apply_autoscale(session, plan)
        for cluster in list(session.scalars(select(Cluster).where(
                Cluster.deleting.is_(False)))):
            try:  # one cluster's trouble never stops the others' nodes
                with session.begin_nested():
                    quiet = self._tick_cluster(session, cluster, stamp, elapsed, horizon)
            except Exception as exc:
                log.exception("cluster %s: reconciling its nodes failed", cluster.name)
                with session.begin_nested():
                    broken(session, cluster, f"reconciling its nodes failed: "
                           f"{type(exc).__name__}: {exc}")
                quiet = False
            settled = settled and quiet
        return settled

    def _tick_cluster(self, session: Session, cluster: Cluster, stamp: float,
                      elapsed: float, horizon: float) -> bool:
        cluster_view(cluster)  # a row the scheduler cannot read is this cluster's error too
        nodes = list(session.scalars(select(Node).where(Node.cluster_id == cluster.id)
                                     .order_by(Node.index)))
        self._prepare(session, cluster, nodes, stamp)
        self._remove_gone(session, cluster, nodes)
        if discovery.is_discovered(cluster):
            self._discover(session, cluster, stamp)
            self.timed = True
        else:
            self._scale(session, cluster, stamp)
        if cluster.spec.get("vm_priority") == "lowpriority":
            self._chaos(session, cluster, elapsed)
            self.timed = self.timed or bool(cluster.spec.get("preemption_rate"))
        if cluster.spec.get("autoscale"):
            self.timed = True
        nodes = self._allocation_state(session, cluster)
        if cluster.spec.get("health_check_every"):
            backend = get_backend(cluster.backend)
            if checks_health(backend):  # (agents check their own machines)
                self.health.tick(session, cluster, nodes, backend.check_health)
                self.timed = True
        return len(nodes) == cluster.target_nodes and all(
            _quiet(n, stamp + horizon) for n in nodes)

    def _apply_autoscale(self, session: Session, plan: Plan) -> None:
        for cluster_id, target in plan.scale_targets.items():
            cluster = session.get(Cluster, cluster_id)
            if cluster is not None and discovery.is_discovered(cluster):
                continue  # Ray: demand goes to Ray's autoscaler (discovery._ask_autoscaler)
            if cluster is not None and cluster.target_nodes != target:
                common.record(session, "cluster", cluster.id, str(cluster.target_nodes),
                              str(target), "autoscale")
                cluster.target_nodes = target
        for node_id in plan.release_nodes:
            node = session.get(Node, node_id)
            owner = session.get(Cluster, node.cluster_id) if node is not None else None
            if owner is not None and discovery.is_discovered(owner):
                continue  # a Ray node leaves when Ray's autoscaler stops it
            if node is not None and node.job_id is None and node.state == "idle":
                node.state = "leaving"
                node.reason = "idle longer than idle_seconds_before_scaledown"
                cluster = session.get(Cluster, node.cluster_id)
                if cluster is not None:
                    cluster.target_nodes = max(0, cluster.target_nodes - 1)

    def _prepare(self, session: Session, cluster: Cluster, nodes: list[Node],
                 stamp: float) -> None:
        backend = get_backend(cluster.backend)
        setup = cluster.spec.get("setup_task")
        for node in nodes:
            if node.state != "preparing" or (node.ready_at or 0) > stamp:
                continue
            if not setup or not isinstance(backend, SupportsSetupTask):
                self._ready(node, stamp)
                continue
            resources: dict[str, Any] = dict(node.resources)
            if not resources.get("setup_started"):
                backend.start_setup(node_info(node), setup["command"], setup.get("env") or {})
                node.resources = {**resources, "setup_started": stamp}
                continue
            code = backend.setup_result(node_info(node))
            if code is None:
                continue
            if code == 0:
                self._ready(node, stamp)
            else:
                node.state = "unusable"
                node.reason = (f"setup task failed with exit code {code} (see `batchyard "
                               f"cluster file list -n {cluster.name}`)")
                common.record(session, "node", node.id, "preparing", "unusable", node.reason)

    @staticmethod
    def _ready(node: Node, stamp: float) -> None:
        node.state = "idle"
        node.idle_since = stamp
        node.reason = None

    def _remove_gone(self, session: Session, cluster: Cluster, nodes: list[Node]) -> None:
        backend = get_backend(cluster.backend)
        for node in nodes:
            if node.state in GONE and node.job_id is None:
                backend.remove_node(node_info(node))
                common.record(session, "node", node.id, node.state, None, node.reason)
                session.delete(node)
        session.flush()

    @staticmethod
    def _discover(session: Session, cluster: Cluster, stamp: float) -> None:
        try:
            discovery.sync(session, cluster, stamp)
        except Exception as exc:  # an unreachable Ray head must not stop other clusters
            log.warning("cluster %s: node discovery failed: %s", cluster.name, exc)

    def _scale(self, session: Session, cluster: Cluster, stamp: float) -> None:
        nodes = list(session.scalars(select(Node).where(Node.cluster_id == cluster.id)
                                     .order_by(Node.index)))
        active = [n for n in nodes if n.state not in GONE]
        target = cluster.target_nodes
        if len(active) < target:
            ws = session.get(Workspace, cluster.workspace_id)
            assert ws is not None
            for _ in range(target - len(active)):  # one by one: as many as there is room for
                try:
                    add_nodes(session, cluster, 1, ws.name, stamp)
                except NoCapacity as exc:  # the machine has no GPU left for another node
                    broken(session, cluster, f"cannot add a node: {exc}")
                    break
        elif len(active) > target:
            surplus = len(active) - target
            free_first = sorted(active, key=lambda n: (n.job_id is not None, -n.index))
            option = (cluster.spec.get("manual") or {}).get("node_deallocation_option",
                                                              "requeue")
            for node in free_first[:surplus]:
                node.state = "leaving"
                node.reason = "removed by resize"
                if node.job_id is None:
                    continue
                node.reason = f"removed by resize (node_deallocation_option {option})"
                if option == "requeue":
                    interrupt(session, node.job_id, "requeue", f"node {node.name} was removed "
                              "by a resize; the job goes back to the queue", 30.0, notice=True)
                elif option == "terminate":
                    interrupt(session, node.job_id, "deallocated", f"node {node.name} was "
                              "removed by a resize (node_deallocation_option terminate)", 30.0)

    def _chaos(self, session: Session, cluster: Cluster, elapsed: float) -> None:
        rate = float(cluster.spec.get("preemption_rate") or 0.0)
        if rate <= 0:
            return
        chance = rate * elapsed / 3600.0
        for node in session.scalars(select(Node).where(Node.cluster_id == cluster.id,
                                                       Node.state == "running")):
            if self.rng.random() < chance:
                preempt(session, cluster, node, "evicted by the preemption chaos setting")

    @staticmethod
    def _allocation_state(session: Session, cluster: Cluster) -> list[Node]:
        nodes = list(session.scalars(select(Node).where(Node.cluster_id == cluster.id)))
        active = [n for n in nodes if n.state not in GONE]
        busy = any(n.state in ("preparing", "leaving", "preempted") for n in nodes)
        cluster.state = "resizing" if busy or len(active) != cluster.target_nodes else "steady"
        return nodes


def _quiet(node: Node, until: float) -> bool:
    """Nothing of this node's is due before ``until``: a node that waits out its
    provisioning delay changes at a known time; one leaving or running its setup task is
    looked at every pass."""
    if node.state in GONE:
        return False
    if node.state == "preparing":
        return (node.ready_at or 0) > until and not (node.resources or {}).get("setup_started")
    return True


def broken(session: Session, cluster: Cluster, why: str) -> None:
    """A cluster whose pass failed is in ``error`` with the reason as an event (once, not
    every pass); its next good pass sets its allocation state again."""
    if cluster.state != "error":
        common.record(session, "cluster", cluster.id, cluster.state, "error", why[:2000])
        cluster.state = "error"


def preempt(session: Session, cluster: Cluster, node: Node, why: str) -> None:
    """Evict a node as the cloud evicts a low-priority VM: its ranks get the job's
    checkpoint notice, then SIGTERM and the cluster's grace period, the job is requeued, and
    the node is replaced."""
    grace = float(cluster.spec.get("preemption_grace", 30.0))
    previous = node.state
    node.state = "preempted"
    node.reason = why
    common.record(session, "node", node.id, previous, "preempted", why)
    if node.job_id is not None:
        interrupt(session, node.job_id, "preempted", f"node {node.name} was preempted", grace)


def cluster_view(c: Cluster) -> ClusterView:
    """What the scheduler sees of a cluster; raises on a row it cannot read."""
    auto = c.spec.get("autoscale") or {}
    return ClusterView(
        id=c.id, name=c.name, workspace_id=c.workspace_id, family=str(c.size.get("family")),
        vcpus_per_node=int(c.size.get("vcpus") or 1), gpus_per_node=int(c.size.get("gpus") or 0),
        autoscale=bool(auto), min_nodes=int(auto.get("min_nodes", 0)),
        max_nodes=int(auto.get("max_nodes", c.target_nodes)), target_nodes=c.target_nodes,
        idle_seconds_before_scaledown=float(auto.get("idle_seconds_before_scaledown", 1800)),
    )
