from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict
from sqlalchemy.orm import Session

from batchyard.server.auth import require_admin
from batchyard.server.routers.deps import CommitRoute, session
from batchyard.server.services import experiments

router = APIRouter(tags=["experiments"], dependencies=[Depends(require_admin)],
                   route_class=CommitRoute)


class ExperimentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    exist_ok: bool = False


@router.post("/workspaces/{ws}/experiments", status_code=201)
def create(ws: str, body: ExperimentIn, s: Session = Depends(session)) -> dict[str, Any]:
    return experiments.create(s, ws, body.name, exist_ok=body.exist_ok)


@router.get("/workspaces/{ws}/experiments")
def list_all(ws: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return experiments.list_all(s, ws)


@router.get("/workspaces/{ws}/experiments/{exp}")
def show(ws: str, exp: str, s: Session = Depends(session)) -> dict[str, Any]:
    return experiments.show(s, ws, exp)


@router.delete("/workspaces/{ws}/experiments/{exp}", status_code=204)
def delete(ws: str, exp: str, s: Session = Depends(session)) -> Response:
    experiments.delete(s, ws, exp)
    return Response(status_code=204)
