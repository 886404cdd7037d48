"""The usage report (issue 35): GPU-hours, CPU-hours and node-hours of the attempts' actual
running intervals (started to ended, or now), clipped to [since, until], grouped by user,
team, workspace, cluster or node size, with a cost where the size has a price. A job keeps
the team its submitter was in, so a removed team keeps its history."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import SpecError
from batchyard.store.identity import Price
from batchyard.store.models import Attempt, Cluster, Job, Workspace, now

BY = ("user", "team", "workspace", "cluster", "size")
NONE = "-"


def report(session: Session, by: str, since: float, until: float | None) -> dict[str, Any]:
    if by not in BY:
        raise SpecError(f"by: one of {', '.join(BY)}, not {by!r}")
    until = now() if until is None else until
    if until <= since:
        raise SpecError("until: must be after since")
    prices = {p.size: (p.per_hour, p.currency) for p in session.scalars(select(Price))}
    query = (select(Attempt.started_at, Attempt.ended_at, Attempt.node_ids, Job.created_by,
                    Job.team, Workspace.name, Cluster.name, Cluster.size)
             .join(Job, Job.id == Attempt.job_id)
             .join(Workspace, Workspace.id == Job.workspace_id)
             .outerjoin(Cluster, Cluster.id == Job.cluster_id)
             .where(Attempt.started_at.is_not(None), Attempt.started_at < until,
                    Attempt.ended_at.is_(None) | (Attempt.ended_at > since)))
    rows: dict[str, dict[str, Any]] = {}
    at = now()
    for started, ended, node_ids, user, team, ws, cluster, size in session.execute(query):
        end = min(until, ended if ended is not None else at)
        hours = max(0.0, end - max(since, started)) / 3600
        if hours <= 0:
            continue
        size = size or {}
        size_name = str(size.get("name") or NONE)
        key = {"user": user, "team": team, "workspace": ws, "cluster": cluster,
               "size": size_name}[by] or NONE
        row = rows.setdefault(key, {by: key, "gpu_hours": 0.0, "cpu_hours": 0.0,
                                    "node_hours": 0.0, "costs": {}})
        nodes = len(node_ids or ())
        row["gpu_hours"] += hours * nodes * int(size.get("gpus") or 0)
        row["cpu_hours"] += hours * nodes * int(size.get("vcpus") or 0)
        row["node_hours"] += hours * nodes
        price = prices.get(size_name)
        if price is not None:
            row["costs"][price[1]] = row["costs"].get(price[1], 0.0) + hours * nodes * price[0]
    out = []
    for key in sorted(rows):
        row = rows[key]
        costs = row.pop("costs")
        for name in ("gpu_hours", "cpu_hours", "node_hours"):
            row[name] = round(row[name], 6)
        if len(costs) == 1:
            (currency, amount), = costs.items()
            row["cost"], row["currency"] = round(amount, 4), currency
        else:  # no price, or prices in several currencies (never added together)
            row["cost"], row["currency"] = None, None
            if costs:
                row["costs"] = {c: round(v, 4) for c, v in sorted(costs.items())}
        out.append(row)
    return {"by": by, "since": since, "until": until, "rows": out}
