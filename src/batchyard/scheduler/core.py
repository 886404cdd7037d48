"""Gang scheduling with EASY backfill, quotas and autoscale, as one pure pass.

Jobs are taken in one global order (highest priority first, then submit order) so that quota
shared by clusters of one family goes to the most important job first. Per cluster the first
job that cannot start becomes the head and gets a reservation; later jobs start only if they
cannot delay it (EASY backfill). Everything is O(1) per job after the initial sorts, so a
100k-job queue on 10k nodes is scheduled in well under a second.
"""

from __future__ import annotations

import math
from collections import defaultdict
from operator import attrgetter

from batchyard.scheduler import reasons
from batchyard.scheduler.autoscale import finish_cluster
from batchyard.scheduler.model import (
    JobView,
    NodeView,
    Placement,
    Plan,
    Reservation,
    Snapshot,
)
from batchyard.scheduler.nodes import NodePool
from batchyard.scheduler.quota import HELD, NEVER, OK, QuotaGroup, QuotaLedger, outlives


def order(jobs: list[JobView]) -> list[JobView]:
    """Priority high to low, FIFO within a priority.

    Two stable sorts on C-level keys instead of one on a Python tuple: several times faster
    at 100k jobs, and linear when the store already returns the queue in order.
    """
    ordered = sorted(jobs, key=attrgetter("seq"))
    ordered.sort(key=attrgetter("priority"), reverse=True)
    return ordered


def _pools(snapshot: Snapshot) -> dict[int, NodePool]:
    by_cluster: dict[int, list[NodeView]] = defaultdict(list)
    for node in snapshot.nodes:
        by_cluster[node.cluster_id].append(node)
    now = snapshot.now
    pools = {
        cid: NodePool(cluster, by_cluster.get(cid, []), now)
        for cid, cluster in snapshot.clusters.items()
    }
    if snapshot.running:
        node_state = {node.id: node.state for node in snapshot.nodes}
        for run in snapshot.running:
            pool = pools.get(run.cluster_id)
            if pool is not None:
                pool.add_running(run, node_state, now)
    return pools


class _Pass:
    """The state of one scheduling pass; methods are the per-job decision steps."""

    __slots__ = ("ledger", "now", "plan", "pools")

    def __init__(self, snapshot: Snapshot) -> None:
        self.now = snapshot.now
        self.plan = Plan()
        self.pools = _pools(snapshot)
        self.ledger = QuotaLedger(snapshot)

    def run(self, queued: list[JobView]) -> Plan:
        pending = self.plan.pending
        pools = self.pools
        # cluster id -> (reason if lower priority than the head, reason otherwise, head
        # priority, largest gang that could ever start, workspace) for clusters where nothing
        # more can happen this pass: head chosen, no free node, scale demand complete.
        saturated: dict[int, tuple[str, str, int, int, int]] = {}
        for job in order(queued):
            cid = job.cluster_id
            sat = saturated.get(cid)
            if sat is not None and job.nodes <= sat[3] and job.workspace_id == sat[4]:
                # Deep in the queue: one shared string, no f-string, no method call.
                pending[job.id] = sat[0] if job.priority < sat[2] else sat[1]
                continue
            pool = pools.get(cid)
            if pool is None:
                pending[job.id] = f"cluster {cid} does not exist"
                continue
            self.consider(job, pool)
            head = pool.head
            if head is not None and pool.next_free == pool.free_initial and not pool.demand_open:
                saturated[cid] = (
                    pool.behind_higher,
                    pool.behind_earlier,
                    head.priority,
                    self.largest_gang(pool),
                    pool.cluster.workspace_id,
                )
        for pool in pools.values():
            finish_cluster(pool, self.plan, self.now)
        return self.plan

    def largest_gang(self, pool: NodePool) -> int:
        """The biggest gang that may get the shared 'waiting behind' reason.

        Larger ones take the slow path, which words why they can never start.
        """
        cluster = pool.cluster
        largest = pool.capacity
        groups = self.ledger.groups
        group = groups.get((cluster.workspace_id, cluster.family)) if groups else None
        if group is not None:
            if cluster.vcpus_per_node:
                largest = min(largest, int(group.vcpu_limit // cluster.vcpus_per_node))
            if cluster.gpus_per_node:
                largest = min(largest, int(group.gpu_limit // cluster.gpus_per_node))
        return largest

    def consider(self, job: JobView, pool: NodePool) -> None:
        cluster = pool.cluster
        nodes = job.nodes
        pending = self.plan.pending
        if nodes < 1 or nodes > pool.capacity:
            pending[job.id] = reasons.never_fits(
                nodes, cluster.name, pool.capacity, cluster.autoscale
            )
            return
        group = self.ledger.group(job, cluster)
        vcpus = nodes * cluster.vcpus_per_node
        gpus = nodes * cluster.gpus_per_node
        end = math.inf if job.wall_clock is None else self.now + job.wall_clock
        code = OK if group is None else group.check(vcpus, gpus, end)
        if code == NEVER and group is not None:
            pending[job.id] = group.reason(code, vcpus, gpus, job, self.now)
            return
        head = pool.head
        if head is None:
            if code == OK and nodes <= pool.free_left:
                self.place(job, pool, group, vcpus, gpus, end, backfill=False)
                pool.ends.append((end, nodes))
            else:
                self.make_head(job, pool, group, code, vcpus, gpus)
            return
        free_left = pool.free_left
        if nodes > free_left:
            pending[job.id] = (
                pool.behind_higher if job.priority < head.priority else pool.behind_earlier
            ) + f"; needs {reasons.plural(nodes, 'idle node')}, {free_left} idle"
            self.demand(pool, group, nodes, vcpus, gpus)
            return
        if nodes > pool.extra and outlives(end, pool.start):
            why = (
                "it has no wall-clock limit, so it may only use nodes that job does not need"
                if job.wall_clock is None
                else "starting it now would delay that job"
            )
            pending[job.id] = (
                pool.behind_higher if job.priority < head.priority else pool.behind_earlier
            ) + f"; {why}"
            self.demand(pool, group, nodes, vcpus, gpus)
            return
        if code != OK and group is not None:
            pending[job.id] = group.reason(code, vcpus, gpus, job, self.now)
            return
        self.place(job, pool, group, vcpus, gpus, end, backfill=True)
        if outlives(end, pool.start):
            pool.extra -= nodes

    def place(
        self,
        job: JobView,
        pool: NodePool,
        group: QuotaGroup | None,
        vcpus: int,
        gpus: int,
        end: float,
        backfill: bool,
    ) -> None:
        self.plan.placements.append(Placement(job.id, pool.take(job.nodes), backfill))
        if group is not None:
            group.charge(vcpus, gpus, end)

    def make_head(
        self,
        job: JobView,
        pool: NodePool,
        group: QuotaGroup | None,
        code: int,
        vcpus: int,
        gpus: int,
    ) -> None:
        """Fix the head's reservation: when both its nodes and its quota can be there."""
        now = self.now
        start = pool.earliest(job.nodes, now)
        if group is not None:
            if code == HELD:
                # Not before the holder's own start; a lower bound keeps backfill cautious.
                start = max(start, group.start)
            else:
                start = max(start, group.earliest(vcpus, gpus, now))
        pool.reserve(job, start)
        if group is not None and group.holder is None:
            group.hold(job, vcpus, gpus, start)
        cluster_id = pool.cluster.id
        self.plan.reservations[cluster_id] = Reservation(cluster_id, job.id, start, pool.extra)
        pool.head_quota_reason = (
            None if code == OK or group is None else group.reason(code, vcpus, gpus, job, now)
        )
        when = reasons.expected_start(start, now)
        pool.behind_higher = reasons.behind(job.id, "higher priority", when)
        pool.behind_earlier = reasons.behind(job.id, "submitted earlier", when)
        self.plan.pending[job.id] = ""  # worded in finish_cluster, once the scale target is known
        if code == OK:
            self.demand(pool, group, job.nodes, vcpus, gpus)

    @staticmethod
    def demand(
        pool: NodePool, group: QuotaGroup | None, nodes: int, vcpus: int, gpus: int
    ) -> None:
        """Count a waiting gang toward scale-up, unless quota could not pay for it anyway."""
        if not pool.demand_open:
            return
        if group is not None:
            if group.vcpu_used + pool.demand_vcpu + vcpus > group.vcpu_limit:
                return
            if group.gpu_used + pool.demand_gpu + gpus > group.gpu_limit:
                return
            pool.demand_vcpu += vcpus
            pool.demand_gpu += gpus
        pool.record_demand(nodes)


def schedule(snapshot: Snapshot) -> Plan:
    """One scheduling pass: placements, scale targets, node releases and pending reasons.

    Pure and deterministic for a given snapshot, so the reconciler can call it every pass and
    a crash between passes loses nothing: the next pass recomputes the same decisions.
    """
    return _Pass(snapshot).run(snapshot.queued)
