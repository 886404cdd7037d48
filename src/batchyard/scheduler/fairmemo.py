"""Verdicts of the cheap refusal, remembered while a cluster's state stands still.

Why: in the fair walk a cluster that can place nothing more but is not saturated in the
plain walk's sense (say its quota is promised to a head due later, so a short job could still
backfill) sends every one of its jobs through the full per-job steps, run after run: at 100k
queued that was most of a pass. Between two changes of the cluster's state (a placement
anywhere, since quota is shared by a family; its head; its quota's holder) the cheap refusal
(``_Pass.refuse_cheaply``) depends on a job only through its gang size, its workspace, its
priority and where its end falls against the two reservations, so the verdict for that key is
kept. A quota refusal changes nothing; one behind the head counts toward scale-up while the
cluster's autoscale demand is open, so it is taken from the table only once that closed.
A job whose key was not seen in this state takes the full steps (which also find saturation);
the verdict is taken for later jobs only when those steps changed nothing."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from batchyard.scheduler.model import JobView
from batchyard.scheduler.nodes import DELAYS, NO_WALL, SHORT, NodePool
from batchyard.scheduler.quota import NEVER, OK

if TYPE_CHECKING:
    from batchyard.scheduler.core import _Pass

SLOW = -1  # the cheap refusal does not settle it: the full steps
# (gang size, where its end falls against the cluster's and the quota's reservations:
# (end > pstart) + 2 * (end > gstart), 4 without a wall clock; workspace), per priority
Key = tuple[int, int, int]


class Verdicts:
    """One cluster's remembered verdicts and the state they hold for."""

    __slots__ = ("demand", "gstart", "head", "holder", "placed", "pool", "pstart", "tables")

    def __init__(self, pool: NodePool) -> None:
        self.pool = pool
        self.placed = -1
        self.demand = True
        self.head: JobView | None = None
        self.holder: JobView | None = None
        self.pstart = math.inf
        self.gstart = math.inf
        self.tables: dict[int, dict[Key, int | str]] = {}

    def current(self, placed: int, priority: int) -> dict[Key, int | str] | None:
        """The table for the cluster's state now and the priority (a quota reason words how
        it stands to the holder's), emptied if the state changed; None when verdicts cannot
        be kept (no head yet)."""
        pool = self.pool
        head = pool.head
        if head is None:
            return None
        group = pool.own_group
        holder = group.holder if group is not None else None
        if (placed != self.placed or head is not self.head or holder is not self.holder
                or pool.demand_open != self.demand):
            self.placed = placed
            self.demand = pool.demand_open
            self.head = head
            self.holder = holder
            self.pstart = pool.start
            self.gstart = group.start if group is not None else math.inf
            self.tables = {}
        table = self.tables.get(priority)
        if table is None:
            table = self.tables[priority] = {}
        return table


def verdict(p: _Pass, pool: NodePool, job: JobView) -> int | str:
    """What ``_Pass.refuse_cheaply`` does with the job, without doing it: SLOW, the cause of
    a reason behind the head (SHORT, NO_WALL, DELAYS), or a quota reason. The same tests in
    the same order; the property test holds the two walks to the same plans."""
    nodes = job.nodes
    if nodes < 1 or nodes > pool.largest:
        return SLOW
    if p.ledger.groups and job.workspace_id != pool.cluster.workspace_id:
        return SLOW
    wall = job.wall_clock
    if nodes > pool.free_initial - pool.next_free:
        return SHORT
    if nodes > pool.extra and (wall is None or p.now + wall > pool.start):
        return NO_WALL if wall is None else DELAYS
    group = pool.own_group
    if group is None:
        return SLOW
    cluster = pool.cluster
    vcpus = nodes * cluster.vcpus_per_node
    gpus = nodes * cluster.gpus_per_node
    code = group.check(vcpus, gpus, math.inf if wall is None else p.now + wall)
    if code in (OK, NEVER):
        return SLOW
    return group.reason(code, vcpus, gpus, job, p.now)
