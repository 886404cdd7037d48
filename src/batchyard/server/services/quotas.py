"""Quotas per workspace and node family, as Azure had them: a vCPU limit per family
(24 by default for GPU families, which is what seed 000 ran into with two NC24r nodes) and an
optional GPU limit. Allocating nodes (creating or growing a cluster) must fit the allocated
limit; the scheduler holds a job back when the vCPUs it would put to work exceed it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import QuotaExceeded, SpecError
from batchyard.scheduler import QuotaView
from batchyard.server.services import common
from batchyard.states import NODE_GONE
from batchyard.store.models import Cluster, Node, Quota, Workspace

DEFAULT_GPU_FAMILY_VCPUS = 24
GONE = NODE_GONE


def _defaults(is_gpu: bool) -> tuple[int | None, int | None]:
    return (DEFAULT_GPU_FAMILY_VCPUS if is_gpu else None), None


def _count(size: dict[str, Any], key: str) -> int:
    """A size's vCPUs or GPUs; 0 for a value no version wrote as a number (such a cluster is
    in error and schedules nothing: see nodes.broken), so the workspace's other clusters
    keep working."""
    try:
        return int(size.get(key) or 0)
    except (TypeError, ValueError):
        return 0


def limit_for(session: Session, workspace_id: int, family: str,
              is_gpu: bool) -> tuple[int | None, int | None]:
    row = session.scalar(select(Quota).where(Quota.workspace_id == workspace_id,
                                             Quota.family == family))
    if row is None:
        return _defaults(is_gpu)
    return row.vcpu_limit, row.gpu_limit


def allocated(session: Session, workspace_id: int, family: str) -> tuple[int, int]:
    """(vCPUs, GPUs) of the nodes the workspace holds in ``family``."""
    vcpus = gpus = 0
    clusters = session.scalars(select(Cluster).where(Cluster.workspace_id == workspace_id,
                                                     Cluster.deleting.is_(False)))
    for c in clusters:
        if c.size.get("family") != family:
            continue
        count = len([n for n in session.scalars(select(Node).where(Node.cluster_id == c.id))
                     if n.state not in GONE])
        vcpus += count * _count(c.size, "vcpus")
        gpus += count * _count(c.size, "gpus")
    return vcpus, gpus


def check_allocation(session: Session, workspace_id: int, size: dict[str, Any],
                     extra_nodes: int, what: str) -> None:
    if extra_nodes <= 0:
        return
    family = str(size.get("family"))
    is_gpu = int(size.get("gpus") or 0) > 0
    vcpu_limit, gpu_limit = limit_for(session, workspace_id, family, is_gpu)
    used_vcpus, used_gpus = allocated(session, workspace_id, family)
    need_vcpus = extra_nodes * int(size.get("vcpus") or 0)
    need_gpus = extra_nodes * int(size.get("gpus") or 0)
    if vcpu_limit is not None and used_vcpus + need_vcpus > vcpu_limit:
        raise QuotaExceeded(
            f"quota: {what} needs {need_vcpus} vCPUs of {family} ({extra_nodes} x "
            f"{size.get('name')}), but the workspace quota is {vcpu_limit} vCPUs with "
            f"{used_vcpus} in use; ask an admin to raise it (`batchyard quota set`)")
    if gpu_limit is not None and used_gpus + need_gpus > gpu_limit:
        raise QuotaExceeded(
            f"quota: {what} needs {need_gpus} GPUs of {family}, but the workspace quota is "
            f"{gpu_limit} GPUs with {used_gpus} in use")


def quota_views(session: Session, clusters: Iterable[Cluster],
                nodes: list[Node]) -> list[QuotaView]:
    """What the scheduler sees: per workspace and family, the limit and the vCPUs/GPUs that
    running jobs hold."""
    by_cluster = {c.id: c for c in clusters}
    used: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    gpu_family: dict[tuple[int, str], bool] = {}
    for c in by_cluster.values():
        key = (c.workspace_id, str(c.size.get("family")))
        used[key]
        gpu_family[key] = _count(c.size, "gpus") > 0
    for n in nodes:
        owner = by_cluster.get(n.cluster_id)
        if owner is None or n.job_id is None:
            continue
        key = (owner.workspace_id, str(owner.size.get("family")))
        used[key][0] += _count(owner.size, "vcpus")
        used[key][1] += _count(owner.size, "gpus")
    views = []
    names: dict[int, str] = {}
    if used:
        names = {row[0]: row[1] for row in session.execute(select(
            Workspace.id, Workspace.name).where(Workspace.id.in_({w for w, _ in used})))}
    for (ws_id, family), (vcpus, gpus) in used.items():
        vcpu_limit, gpu_limit = limit_for(session, ws_id, family, gpu_family[(ws_id, family)])
        views.append(QuotaView(ws_id, family, vcpu_limit, vcpus, gpu_limit, gpus,
                               workspace=names.get(ws_id, "")))
    return views


def set_quota(session: Session, workspace: str, family: str, vcpus: int | None,
              gpus: int | None) -> dict[str, Any]:
    if (vcpus is not None and vcpus < 0) or (gpus is not None and gpus < 0):
        raise SpecError("vcpus/gpus: limits must not be negative")
    ws = common.workspace(session, workspace)
    row = session.scalar(select(Quota).where(Quota.workspace_id == ws.id,
                                             Quota.family == family))
    if row is None:
        row = Quota(workspace_id=ws.id, family=family)
        session.add(row)
    row.vcpu_limit = vcpus
    row.gpu_limit = gpus
    session.flush()
    return {"workspace": ws.name, "family": family, "vcpu_limit": vcpus, "gpu_limit": gpus}


def usage(session: Session, workspace: str) -> list[dict[str, Any]]:
    ws = common.workspace(session, workspace)
    families: dict[str, bool] = {}
    for c in session.scalars(select(Cluster).where(Cluster.workspace_id == ws.id,
                                                   Cluster.deleting.is_(False))):
        families[str(c.size.get("family"))] = _count(c.size, "gpus") > 0
    for row in session.scalars(select(Quota).where(Quota.workspace_id == ws.id)):
        families.setdefault(row.family, False)
    nodes = list(session.scalars(select(Node)))
    clusters = list(session.scalars(select(Cluster).where(Cluster.workspace_id == ws.id)))
    in_use = {v.family: v for v in quota_views(session, clusters, nodes)}
    out = []
    for family, is_gpu in sorted(families.items()):
        vcpu_limit, gpu_limit = limit_for(session, ws.id, family, is_gpu)
        alloc_vcpus, alloc_gpus = allocated(session, ws.id, family)
        view = in_use.get(family)
        out.append({"family": family, "vcpus_allocated": alloc_vcpus,
                    "vcpus_in_use": view.vcpu_used if view else 0, "vcpu_limit": vcpu_limit,
                    "gpus_allocated": alloc_gpus, "gpus_in_use": view.gpu_used if view else 0,
                    "gpu_limit": gpu_limit})
    return out
