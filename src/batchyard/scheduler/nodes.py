"""One cluster's nodes during one pass: free list, node counts, and the head's reservation.

Nodes of a cluster are interchangeable (one size, one job per node), so the reservation is a
count, not a set of named nodes: the classic EASY argument holds on counts alone.
"""

from __future__ import annotations

import math

from batchyard.scheduler import reasons
from batchyard.scheduler.model import ClusterView, JobView, NodeView, RunningJobView
from batchyard.scheduler.quota import QuotaGroup

# Why a job behind the head waits (NodePool.behind_reason)
SHORT = 0  # fewer idle nodes than its gang
NO_WALL = 1  # no wall clock, and the head needs the idle nodes
DELAYS = 2  # it would still run when the head is due to start

# Nodes in these states never come back to the pool by themselves. Leaving and preempted
# nodes are also no longer members (the backend replaces them); unusable ones still are.
LOST_STATES = frozenset({"leaving", "unusable", "preempted"})


class NodePool:
    """Mutable per-pass state of one cluster; the scheduler's hot loop reads its attributes."""

    __slots__ = (
        "behind_earlier",
        "behind_fair",
        "behind_higher",
        "busy",
        "capacity",
        "cluster",
        "demand",
        "demand_gpu",
        "demand_nodes",
        "demand_open",
        "demand_vcpu",
        "ends",
        "extra",
        "free",
        "free_ids",
        "free_initial",
        "growable",
        "head",
        "head_quota_held",
        "head_quota_reason",
        "head_short_nodes",
        "holders",
        "inflight",
        "largest",
        "leaving",
        "members",
        "next_free",
        "note",
        "note_caches",
        "own_group",
        "preempted",
        "preparing",
        "reason_cache",
        "start",
        "unusable",
    )

    def __init__(self, cluster: ClusterView, nodes: list[NodeView], now: float) -> None:
        self.cluster = cluster
        free: list[NodeView] = []
        busy = preparing = leaving = unusable = preempted = 0
        for node in nodes:
            state = node.state
            if state == "idle" and node.job_id is None:
                free.append(node)
            elif state == "preparing" and node.job_id is None:
                preparing += 1
            elif state == "leaving":
                leaving += 1
            elif state in ("unusable", "lost"):  # lost: a machine whose agent is silent
                unusable += 1
            elif state == "preempted":
                preempted += 1
            else:
                busy += 1
        # Most recently idle first: long-idle nodes stay free, reach the idle timeout and can be
        # released, instead of every node being touched now and then and none ever scaling down.
        free.sort(key=lambda n: (-(now if n.idle_since is None else n.idle_since), n.name))
        self.free = free
        self.free_ids = [node.id for node in free]
        self.next_free = 0
        self.free_initial = len(free)
        self.busy = busy
        self.preparing = preparing
        self.leaving = leaving
        self.unusable = unusable
        self.preempted = preempted
        self.members = len(nodes) - leaving - preempted
        # Nodes asked of the backend but not listed yet: the target is ahead of the member list.
        self.inflight = max(0, cluster.target_nodes - self.members)
        if cluster.autoscale:
            self.growable = max(0, cluster.max_nodes - self.members - self.inflight)
            self.capacity = max(cluster.max_nodes, self.members)
        else:
            self.growable = 0
            self.capacity = max(cluster.target_nodes, self.members)
        # (end time, nodes returned to the pool) of running jobs and of this pass's placements
        self.ends: list[tuple[float, int]] = []
        self.holders: list[str] = []  # running jobs holding nodes, for the head's reason
        self.head: JobView | None = None
        self.head_short_nodes = False
        self.head_quota_reason: str | None = None
        self.head_quota_held = False  # its quota reason already says when the holder starts
        self.start = math.inf
        self.extra = 0
        self.behind_higher = ""
        self.behind_earlier = ""
        self.behind_fair = ""  # ahead of it by fair share (another person or team)
        # What the reasons of jobs behind the head start with (fair share: which team goes
        # first), and a reason cache per such start: the fair-share walk sets it per run.
        self.note = ""
        self.reason_cache: dict[int, str] = {}
        self.note_caches: dict[str, dict[int, str]] = {"": self.reason_cache}
        # Set with the head: the largest gang that can ever start (capacity and quota of the
        # cluster's own workspace) and that quota group (a QuotaGroup, or None: unlimited).
        self.largest = 0
        self.own_group: QuotaGroup | None = None
        # Autoscale demand: gang sizes of waiting jobs, in queue order, until the cap is passed.
        self.demand: list[int] = []
        self.demand_nodes = 0
        self.demand_vcpu = 0
        self.demand_gpu = 0
        self.demand_open = cluster.autoscale

    @property
    def free_left(self) -> int:
        return self.free_initial - self.next_free

    @property
    def provisioning(self) -> int:
        return self.preparing + self.inflight

    def add_running(self, job: RunningJobView, node_state: dict[int, str], now: float) -> None:
        """Remember when a running job gives its nodes back (lost nodes never come back)."""
        back = 0
        for node_id in job.node_ids:
            state = node_state.get(node_id)
            if state is not None and state not in LOST_STATES:
                back += 1
        if back:
            self.holders.append(job.name or f"job {job.id}")
            end = math.inf if job.wall_clock is None else job.started_at + job.wall_clock
            # an overrunning job is about to be killed: its nodes are as good as back now
            self.ends.append((max(now, end), back))

    def take(self, count: int) -> tuple[int, ...]:
        """Hand out `count` free nodes; the caller has checked that there are enough."""
        start = self.next_free
        self.next_free = start + count
        if self.reason_cache:
            self.reason_cache.clear()  # the idle count in them changed
        if len(self.note_caches) > 1:
            for cache in self.note_caches.values():
                cache.clear()
        return tuple(self.free_ids[start : start + count])

    def leftover(self) -> list[NodeView]:
        """Free nodes nobody took this pass, most recently idle first."""
        return self.free[self.next_free :]

    def available_at(self, when: float) -> int:
        """Nodes the head could have at `when`: free now, provisioning, room to grow, returns.

        Provisioning and scale-up nodes count as arriving now: that makes the reservation
        earlier, never later, so backfill stays on the safe side of the promise. Jobs without a
        wall clock never count as returning, even at an unknown (infinite) `when`.
        """
        avail = self.free_left + self.provisioning + self.growable
        for end, count in self.ends:
            if end <= when and end < math.inf:
                avail += count
        return avail

    def earliest(self, need: int, now: float) -> float:
        """The earliest time `need` nodes can be free, from running jobs' expected ends."""
        avail = self.free_left + self.provisioning + self.growable
        if avail >= need:
            return now
        self.ends.sort()
        for end, count in self.ends:
            avail += count
            if avail >= need:
                return end
        return math.inf

    def reserve(self, job: JobView, start: float) -> None:
        """Make `job` the head and fix its promise.

        Even with an unknown start the spare is well defined: nodes beyond what the head needs
        once every job with a wall clock has ended can never be the ones it waits for.
        """
        self.head = job
        self.head_short_nodes = job.nodes > self.free_left
        self.start = start
        self.extra = max(0, self.available_at(start) - job.nodes)

    def set_note(self, note: str) -> None:
        """What the next reasons start with (the fair-share walk's, per run)."""
        if note != self.note:
            self.note = note
            cache = self.note_caches.get(note)
            if cache is None:
                cache = self.note_caches[note] = {}
            self.reason_cache = cache

    def behind_reason(self, nodes: int, lower: int, why: int) -> str:
        """The reason of a job waiting behind the head, built once per (gang size, cause).

        Thousands of queued jobs share a few gang sizes: caching keeps a 100k-job pass from
        formatting 100k nearly identical strings. ``lower``: 1 the head has a higher
        priority, 0 it was submitted earlier, 2 it is ahead by fair share.
        """
        key = (nodes * 3 + why) * 3 + lower
        text = self.reason_cache.get(key)
        if text is None:
            base = (self.behind_earlier, self.behind_higher, self.behind_fair)[lower]
            if why == SHORT:
                need = reasons.plural(nodes, "idle node")
                text = f"{base}; needs {need}, {self.free_left} idle"
            elif why == NO_WALL:
                text = (
                    f"{base}; it has no wall-clock limit, "
                    "so it may only use nodes that job does not need"
                )
            else:
                text = f"{base}; starting it now would delay that job"
            if self.note:
                text = f"{self.note}; {text}"
            self.reason_cache[key] = text
        return text

    def record_demand(self, nodes: int) -> None:
        """Queue a gang for scale-up; stop once the queue already asks beyond the maximum."""
        self.demand.append(nodes)
        self.demand_nodes += nodes
        if self.demand_nodes > self.cluster.max_nodes + self.free_initial + self.preparing:
            self.demand_open = False
