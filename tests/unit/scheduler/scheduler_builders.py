"""Small builders so each scheduler test states only what matters to its rule."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from batchyard.scheduler import (
    ClusterView,
    JobView,
    NodeView,
    Plan,
    QuotaView,
    RunningJobView,
    Snapshot,
)

FAMILY = "standardNCFamily"
_ids = itertools.count(1000)


def cluster(
    cid: int = 1,
    *,
    name: str = "gpu",
    workspace_id: int = 3,
    family: str = FAMILY,
    vcpus: int = 6,
    gpus: int = 1,
    autoscale: bool = False,
    min_nodes: int = 0,
    max_nodes: int = 0,
    target: int = 0,
    idle_timeout: float = 1800.0,
) -> ClusterView:
    return ClusterView(
        cid,
        name,
        workspace_id,
        family,
        vcpus,
        gpus,
        autoscale=autoscale,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        target_nodes=target,
        idle_seconds_before_scaledown=idle_timeout,
    )


def nodes(
    cid: int,
    count: int,
    state: str = "idle",
    *,
    first_id: int,
    job_id: int | None = None,
    idle_since: float | None = None,
) -> list[NodeView]:
    return [
        NodeView(first_id + i, cid, f"c{cid}-n{first_id + i}", state, job_id, idle_since)
        for i in range(count)
    ]


def job(
    jid: int,
    nodes: int = 1,
    *,
    cid: int = 1,
    workspace_id: int = 3,
    priority: int = 1,
    seq: int | None = None,
    wall: float | None = None,
) -> JobView:
    return JobView(
        jid,
        cid,
        workspace_id,
        nodes,
        1,
        priority,
        jid if seq is None else seq,
        wall_clock=wall,
    )


def running(
    jid: int, node_ids: Iterable[int], *, cid: int = 1, started: float = 0.0, wall: float | None
) -> RunningJobView:
    return RunningJobView(jid, cid, tuple(node_ids), started, wall)


def busy_nodes(cid: int, count: int, *, first_id: int, job_id: int) -> list[NodeView]:
    return nodes(cid, count, "running", first_id=first_id, job_id=job_id)


def snap(
    clusters: Iterable[ClusterView],
    node_views: Iterable[NodeView],
    queued: Iterable[JobView],
    *,
    now: float = 0.0,
    run: Iterable[RunningJobView] = (),
    quotas: Iterable[QuotaView] = (),
) -> Snapshot:
    return Snapshot(
        now,
        {c.id: c for c in clusters},
        list(node_views),
        list(queued),
        list(run),
        list(quotas),
    )


def placed(plan: Plan) -> dict[int, tuple[int, ...]]:
    return {p.job_id: p.node_ids for p in plan.placements}
