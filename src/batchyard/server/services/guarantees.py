"""Guaranteed capacity of teams on a cluster (issue 35 §2, `batchyard cluster quota`):
set, list, remove, and what the scheduler reads of them (``server.guarantee_book``).

A guarantee is stored in nodes. It is given in GPUs on a cluster whose nodes have GPUs
(a whole number of nodes' worth), or in nodes (`--nodes`) on any cluster; a borrow limit is
in the same unit as the guarantee it comes with."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import NotFound, SpecError
from batchyard.server.services import common
from batchyard.store.identity import Guarantee, Team
from batchyard.store.models import Cluster, Job, now

_RUNNING = ("preparing", "running", "finalizing")


def capacity(cluster: Cluster) -> int:
    """Nodes the cluster can have: its target, or an autoscale cluster's maximum."""
    auto = (cluster.spec or {}).get("autoscale") or {}
    most = int(auto.get("max_nodes", 0)) if auto else 0
    return max(int(cluster.target_nodes or 0), most)


def gpus_per_node(cluster: Cluster) -> int:
    return int((cluster.size or {}).get("gpus") or 0)


def _in_nodes(cluster: Cluster, value: int | None, in_gpus: bool, field: str) -> int | None:
    if value is None:
        return None
    if value < 0:
        raise SpecError(f"{field}: must be 0 or more, not {value}")
    if not in_gpus:
        return value
    per = gpus_per_node(cluster)
    if value % per:
        raise SpecError(f"{field}: {value} GPUs is not a whole number of cluster "
                        f"{cluster.name}'s nodes ({per} GPUs each)")
    return value // per


def _amount(cluster: Cluster, nodes: int | None) -> int | None:
    """Nodes in the cluster's unit: GPUs where its nodes have them, else nodes."""
    if nodes is None:
        return None
    per = gpus_per_node(cluster)
    return nodes * per if per else nodes


def unit_name(cluster: Cluster) -> str:
    return "GPUs" if gpus_per_node(cluster) else "nodes"


def set_guarantee(session: Session, workspace: str, cluster_name: str, team: str,
                  gpus: int | None, nodes: int | None, borrow_limit: int | None
                  ) -> dict[str, Any]:
    ws = common.workspace(session, workspace, create_default=False)
    cluster = common.cluster(session, ws, cluster_name)
    if (gpus is None) == (nodes is None):
        raise SpecError("gpus: give the guarantee as --gpus or as --nodes (one of them)")
    in_gpus = gpus is not None
    if in_gpus and not gpus_per_node(cluster):
        raise SpecError(f"gpus: cluster {cluster.name}'s nodes have no GPUs; give its "
                        "guarantee in nodes (--nodes)")
    field = "gpus" if in_gpus else "nodes"
    guaranteed = _in_nodes(cluster, gpus if in_gpus else nodes, in_gpus, field)
    limit = _in_nodes(cluster, borrow_limit, in_gpus, "borrow_limit")
    found = session.scalar(select(Team).where(Team.name == team))
    if found is None:
        raise SpecError(f"team: no team {team!r} (`batchyard team list` shows them)")
    assert guaranteed is not None
    size = capacity(cluster)
    given = gpus if in_gpus else nodes
    per = gpus_per_node(cluster) if in_gpus else 1

    def count(n: int | None) -> str:
        word = "GPU" if in_gpus else "node"
        return f"{n} {word}" + ("" if n == 1 else "s")

    if guaranteed > size:
        raise SpecError(f"{field}: {count(given)} is more than cluster {cluster.name} has "
                        f"({count(size * per)})")
    others = session.execute(select(Team.name, Guarantee.nodes)
                             .join(Team, Team.id == Guarantee.team_id)
                             .where(Guarantee.cluster_id == cluster.id,
                                    Guarantee.team_id != found.id)).all()
    total = guaranteed + sum(n for _, n in others)
    if total > size:
        named = ", ".join(f"team {t} {n * per}" for t, n in others)
        raise SpecError(f"{field}: the guarantees on cluster {cluster.name} would add up to "
                        f"{count(total * per)}, more than its {count(size * per)} ({named})")
    row = session.scalar(select(Guarantee).where(Guarantee.cluster_id == cluster.id,
                                                 Guarantee.team_id == found.id))
    if row is None:
        row = Guarantee(cluster_id=cluster.id, team_id=found.id)
        session.add(row)
    row.nodes, row.borrow_limit, row.updated_at = guaranteed, limit, now()
    session.flush()
    from batchyard.server import guarantee_book

    guarantee_book.changed()
    return guarantee_dict(session, cluster, found.name, row)


def guarantee_dict(session: Session, cluster: Cluster, team: str, row: Guarantee
                   ) -> dict[str, Any]:
    used = sum(int((j.spec or {}).get("nodes", 1)) for j in session.scalars(select(Job).where(
        Job.cluster_id == cluster.id, Job.team == team, Job.state.in_(_RUNNING))))
    return {"cluster": cluster.name, "team": team, "unit": unit_name(cluster),
            "guaranteed": _amount(cluster, row.nodes), "nodes": row.nodes,
            "borrow_limit": _amount(cluster, row.borrow_limit),
            "in_use": _amount(cluster, used)}


def guarantees(session: Session, workspace: str, cluster_name: str) -> list[dict[str, Any]]:
    ws = common.workspace(session, workspace, create_default=False)
    cluster = common.cluster(session, ws, cluster_name)
    rows = session.execute(select(Guarantee, Team.name).join(Team, Team.id == Guarantee.team_id)
                           .where(Guarantee.cluster_id == cluster.id)
                           .order_by(Team.name)).all()
    return [guarantee_dict(session, cluster, name, row) for row, name in rows]


def remove_guarantee(session: Session, workspace: str, cluster_name: str, team: str
                     ) -> dict[str, Any]:
    ws = common.workspace(session, workspace, create_default=False)
    cluster = common.cluster(session, ws, cluster_name)
    found = session.scalar(select(Team).where(Team.name == team))
    if found is None:
        raise SpecError(f"team: no team {team!r} (`batchyard team list` shows them)")
    row = session.scalar(select(Guarantee).where(Guarantee.cluster_id == cluster.id,
                                                 Guarantee.team_id == found.id))
    if row is None:
        raise NotFound(f"team {team} has no guarantee on cluster {cluster.name}")
    session.delete(row)
    session.flush()
    from batchyard.server import guarantee_book

    guarantee_book.changed()
    return {"cluster": cluster.name, "team": team, "removed": True}
