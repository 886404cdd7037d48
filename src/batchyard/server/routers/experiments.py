from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict
from sqlalchemy.orm import Session

from batchyard.server.routers.deps import CommitRoute, session
from batchyard.server.security.permissions import InWorkspace
from batchyard.server.security.principal import Role
from batchyard.server.services import experiments

router = APIRouter(tags=["experiments"], route_class=CommitRoute)
READ = InWorkspace(Role.reader)


class ExperimentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    exist_ok: bool = False


@router.post("/workspaces/{ws}/experiments", status_code=201, dependencies=[Depends(InWorkspace(
    Role.contributor, "experiment.create", target=lambda p, b: b.get("name")))])
def create(ws: str, body: ExperimentIn, s: Session = Depends(session)) -> dict[str, Any]:
    return experiments.create(s, ws, body.name, exist_ok=body.exist_ok)


@router.get("/workspaces/{ws}/experiments", dependencies=[Depends(READ)])
def list_all(ws: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return experiments.list_all(s, ws)


@router.get("/workspaces/{ws}/experiments/{exp}", dependencies=[Depends(READ)])
def show(ws: str, exp: str, s: Session = Depends(session)) -> dict[str, Any]:
    return experiments.show(s, ws, exp)


@router.delete("/workspaces/{ws}/experiments/{exp}", status_code=204,
               dependencies=[Depends(InWorkspace(Role.owner, "experiment.delete"))])
def delete(ws: str, exp: str, s: Session = Depends(session)) -> Response:
    experiments.delete(s, ws, exp)
    return Response(status_code=204)
