"""Gang scheduling: per cluster, highest priority first, FIFO within a priority, all or
nothing, one job per node. A job that does not fit blocks the jobs behind it (strict order),
so a large gang is never starved by a stream of small ones."""

from __future__ import annotations

from collections import defaultdict

from batchyard.scheduler.model import JobView, NodeView, Placement, Plan, Snapshot


def _order(job: JobView) -> tuple[int, int]:
    return (-job.priority, job.seq)


def _describe_nodes(nodes: list[NodeView]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for node in nodes:
        counts["idle" if node.free else node.state] += 1
    if not counts:
        return "the cluster has no nodes"
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def schedule(snapshot: Snapshot) -> Plan:
    plan = Plan()
    nodes_by_cluster: dict[int, list[NodeView]] = defaultdict(list)
    for node in snapshot.nodes:
        nodes_by_cluster[node.cluster_id].append(node)
    queued_by_cluster: dict[int, list[JobView]] = defaultdict(list)
    for job in snapshot.queued:
        queued_by_cluster[job.cluster_id].append(job)

    for cluster_id, jobs in queued_by_cluster.items():
        nodes = sorted(nodes_by_cluster.get(cluster_id, []), key=lambda n: n.name)
        free = [n for n in nodes if n.free]
        blocked_by: JobView | None = None
        for job in sorted(jobs, key=_order):
            if blocked_by is not None:
                plan.pending[job.id] = (
                    f"waiting behind job {blocked_by.id} (first in line for this cluster)"
                )
                continue
            if len(free) >= job.nodes:
                chosen, free = free[: job.nodes], free[job.nodes :]
                plan.placements.append(Placement(job.id, tuple(n.id for n in chosen)))
            else:
                plan.pending[job.id] = (
                    f"waiting for {job.nodes} idle node{'s' if job.nodes != 1 else ''}: "
                    f"{_describe_nodes(nodes)}"
                )
                blocked_by = job
    return plan
