"""End of a pass, per cluster: the autoscale decision and the head job's reason.

Both need the whole pass (what was placed, what still waits), so they run after the queue
walk. Scale-up follows AML Compute: add what the waiting gangs miss, in queue order, up to the
maximum. Scale-down releases only nodes idle past the timeout that no waiting gang could use.
"""

from __future__ import annotations

from batchyard.scheduler import reasons
from batchyard.scheduler.model import Plan
from batchyard.scheduler.nodes import NodePool


def _scale_up_size(pool: NodePool) -> tuple[int, int]:
    """(desired cluster size, nodes of the waiting gangs it serves), before any release.

    Gangs are added whole and in queue order; the first gang that would pass the maximum
    stops the walk (the very first one is still served as far as the maximum allows), so
    small jobs behind a big head cannot make the cluster grow for themselves first.
    """
    members = pool.members
    spare = pool.free_left + pool.preparing
    max_nodes = pool.cluster.max_nodes
    target = members
    served = 0
    for index, gang in enumerate(pool.demand):
        size = members + max(0, served + gang - spare)
        if size > max_nodes:
            if index == 0:
                target = max(members, max_nodes)
                served = gang
            break
        target = size
        served += gang
    return target, served


def _release(pool: NodePool, needed: int, now: float) -> list[int]:
    """Idle nodes past the timeout, oldest first, that neither waiting jobs nor min need."""
    cluster = pool.cluster
    room = pool.members - cluster.min_nodes
    if room <= 0:
        return []
    timeout = cluster.idle_seconds_before_scaledown
    leftover = pool.leftover()  # most recently idle first
    released: list[int] = []
    for node in reversed(leftover[needed:]):
        if len(released) >= room:
            break
        if node.idle_since is None or now - node.idle_since <= timeout:
            break  # the rest went idle even later
        released.append(node.id)
    return released


def _head_reason(pool: NodePool, target: int | None, now: float) -> str:
    """The head's reason: what it waits for (nodes by state, quota), whether the cluster is
    growing for it, and when it should start, which is what a user asks first."""
    head = pool.head
    assert head is not None
    cluster = pool.cluster
    parts: list[str] = []
    if pool.head_short_nodes:
        if pool.members == 0 and pool.provisioning == 0:
            text = "cluster has no nodes"
        else:
            used = pool.free_initial - pool.free_left
            counts = reasons.node_counts(
                pool.free_left,
                pool.provisioning,
                pool.busy + used,
                pool.leaving,
                pool.unusable,
                pool.preempted,
            )
            text = f"waiting for {reasons.plural(head.nodes, 'idle node')}: {counts}"
            if pool.holders:
                text += f" ({reasons.held_by(pool.holders)})"
        if target is not None:
            if target > pool.members - pool.preparing and target > 0:
                text += f" — scaling up to {target}"
            elif pool.members >= cluster.max_nodes:
                text += f" — the cluster is at its maximum of {cluster.max_nodes}"
        parts.append(text)
    if pool.head_quota_reason is not None:
        parts.append(pool.head_quota_reason)
    if not (pool.head_quota_held and not pool.head_short_nodes):
        parts.append(reasons.expected_start(pool.start, now))
    return "; ".join(parts)


def finish_cluster(pool: NodePool, plan: Plan, now: float) -> None:
    """Write the scale target, node releases and head reason of one cluster into the plan."""
    cluster = pool.cluster
    target: int | None = None
    if cluster.autoscale:
        size, served = _scale_up_size(pool)
        released = _release(pool, min(pool.free_left, served), now) if size <= pool.members else []
        plan.release_nodes.extend(released)
        target = min(max(size - len(released), cluster.min_nodes), cluster.max_nodes)
        if target != cluster.target_nodes:
            plan.scale_targets[cluster.id] = target
    if pool.head is not None:
        plan.pending[pool.head.id] = _head_reason(pool, target, now)
