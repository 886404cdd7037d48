"""Experiments: named groups of jobs."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import Conflict
from batchyard.server.services import common
from batchyard.states import JOB_ACTIVE
from batchyard.store.models import Base, Experiment, Job
from batchyard.store.purge import purge

ACTIVE = JOB_ACTIVE


def create(session: Session, workspace: str, name: str, exist_ok: bool = False) -> dict[str, Any]:
    ws = common.workspace(session, workspace)
    common.check_name("experiment", name)
    existing = session.scalar(select(Experiment).where(Experiment.workspace_id == ws.id,
                                                       Experiment.name == name))
    if existing is not None:
        if exist_ok:
            return common.experiment_dict(session, existing)
        raise Conflict(f"experiment {name!r} already exists in workspace {workspace!r}")
    exp = Experiment(workspace_id=ws.id, name=name)
    session.add(exp)
    session.flush()
    return common.experiment_dict(session, exp)


def list_all(session: Session, workspace: str) -> list[dict[str, Any]]:
    ws = common.workspace(session, workspace)
    exps = session.scalars(select(Experiment).where(Experiment.workspace_id == ws.id)
                           .order_by(Experiment.name))
    return [common.experiment_dict(session, e) for e in exps]


def show(session: Session, workspace: str, name: str) -> dict[str, Any]:
    ws = common.workspace(session, workspace)
    return common.experiment_dict(session, common.experiment(session, ws, name))


def delete(session: Session, workspace: str, name: str) -> None:
    ws = common.workspace(session, workspace)
    exp = common.experiment(session, ws, name)
    if session.scalar(select(Job.id).where(Job.experiment_id == exp.id,
                                           Job.state.in_(ACTIVE)).limit(1)):
        raise Conflict(f"experiment {name!r} has active jobs; terminate them first")
    purge(session, Base.metadata.tables["experiments"], [exp.id])
