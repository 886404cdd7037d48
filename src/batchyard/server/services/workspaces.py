"""Workspaces: the namespace for clusters, experiments, jobs (and, later, quotas)."""

from __future__ import annotations

import shutil
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.config import data_root
from batchyard.errors import Conflict
from batchyard.server.services import common
from batchyard.states import JOB_ACTIVE
from batchyard.store.models import Base, Cluster, Experiment, Job, Workspace
from batchyard.store.purge import forget_orphan_events, purge

ACTIVE = JOB_ACTIVE


def create(session: Session, name: str, location: str | None = None,
           subscription_id: str | None = None, resource_group: str | None = None,
           exist_ok: bool = False, owner: tuple[int | None, str] | None = None
           ) -> dict[str, Any]:
    """``owner``: (user id, name) of its maker, who becomes its first owner."""
    common.check_name("workspace", name)
    existing = session.scalar(select(Workspace).where(Workspace.name == name))
    if existing is not None:
        if exist_ok:
            return common.workspace_dict(existing)
        raise Conflict(f"workspace {name!r} already exists")
    ws = Workspace(name=name, location=location, subscription_id=subscription_id,
                   resource_group=resource_group)
    session.add(ws)
    session.flush()
    if owner is not None:
        from batchyard.server.services.roles import grant_creator

        grant_creator(session, ws, owner[0], by=owner[1])
    return common.workspace_dict(ws)


def list_all(session: Session) -> list[dict[str, Any]]:
    common.workspace(session, common.DEFAULT)
    return [common.workspace_dict(w) for w in session.scalars(select(Workspace).order_by(
        Workspace.name))]


def show(session: Session, name: str) -> dict[str, Any]:
    ws = common.workspace(session, name)
    data = common.workspace_dict(ws)
    data["clusters"] = list(session.scalars(select(Cluster.name).where(
        Cluster.workspace_id == ws.id, Cluster.deleting.is_(False))))
    data["experiments"] = list(session.scalars(select(Experiment.name).where(
        Experiment.workspace_id == ws.id)))
    return data


def update(session: Session, name: str, mlflow_uri: str | None = None) -> dict[str, Any]:
    """Change a workspace's settings: ``mlflow_uri``, an external MLflow tracking server its
    jobs' ranks log to ('' for batchyard's own; jobs started later see the change)."""
    from batchyard.server.mlflow.settings import check_uri

    ws = common.workspace(session, name)
    if mlflow_uri is not None:
        ws.mlflow_uri = check_uri(mlflow_uri) or None
    session.flush()
    return common.workspace_dict(ws)


def delete(session: Session, name: str) -> None:
    ws = common.workspace(session, name, create_default=False)
    if session.scalar(select(Cluster.id).where(Cluster.workspace_id == ws.id,
                                               Cluster.deleting.is_(False)).limit(1)):
        raise Conflict(f"workspace {name!r} still has clusters; delete them first")
    if session.scalar(select(Job.id).where(Job.workspace_id == ws.id,
                                           Job.state.in_(ACTIVE)).limit(1)):
        raise Conflict(f"workspace {name!r} still has active jobs")
    from batchyard.server.services.roles import forget_workspace

    forget_workspace(session, ws)  # (and its roles' cache)
    # its jobs, their attempts, reports, metrics and events, its experiments, sweeps,
    # datastores, quotas, idempotency keys, and the clusters deleted while jobs named them
    purge(session, Base.metadata.tables["workspaces"], [ws.id])
    # and the events of its nodes scaled down, clusters and jobs deleted before: events
    # whose entity is gone (nothing can show them any more, whosever they were)
    forget_orphan_events(session)
    shutil.rmtree(data_root() / "workspaces" / name, ignore_errors=True)  # the jobs' files
