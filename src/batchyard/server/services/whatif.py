"""`job create --what-if` on the server: the submit's own checks, then an answer instead of
a job. Nothing is stored, no code is packed, nothing is audited (nothing changed)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import BatchyardError
from batchyard.scheduler import JobView
from batchyard.server.fairshare_book import ACCOUNTS
from batchyard.server.services import chargeback, common, estimates, submit_rows
from batchyard.server.services.jobs import check_fits
from batchyard.spec.job import PRIORITY_ORDER, JobSpec
from batchyard.store.models import Cluster


def answer(session: Session, workspace: str, spec: JobSpec, *, cluster: str | None,
           created_by: str | None) -> dict[str, Any]:
    """When the job would start if submitted now, and what would start it sooner: fewer
    nodes on its cluster, or another cluster of the workspace that can run it."""
    found = submit_rows.workspace_and_cluster(session, workspace, spec, cluster,
                                              spec.experiment or common.DEFAULT,
                                              spec.name or "what-if")
    ws, c = found.workspace, found.cluster
    check_fits(spec, c)
    others = []
    for other in session.scalars(select(Cluster).where(Cluster.workspace_id == ws.id,
                                                       Cluster.deleting.is_(False),
                                                       Cluster.id != c.id)
                                 .order_by(Cluster.name)):
        try:
            check_fits(spec, other)
        except BatchyardError:
            continue  # it can never run the job there: not an option
        others.append(other)
    wall = spec.limits.max_wall_clock
    view = JobView(0, c.id, ws.id, spec.nodes, spec.distribution.processes_per_node,
                   PRIORITY_ORDER[spec.priority], 0,
                   float(wall) if wall is not None else None,
                   account=ACCOUNTS.id_of(created_by))
    result = estimates.what_if(session, c, others, view)
    result["workspace"] = ws.name
    if wall is None:
        result["notes"] = ["the job has no wall-clock limit (limits.max_wall_clock): it "
                           "holds its nodes until it ends, so jobs behind it cannot be "
                           "estimated"]
    if spec.array:
        result.setdefault("notes", []).append(
            "a job array: this is when its first job would start; the others queue after it")
    team = chargeback.team_of(session, created_by)
    held = chargeback.held_teams(session) if team else {}
    if team in held:
        result.setdefault("notes", []).append(f"it would wait: {held[team]}")
        result["estimated_start"] = None
    return result
