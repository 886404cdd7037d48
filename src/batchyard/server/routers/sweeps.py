"""Sweeps over HTTP: create, list, show (trials sorted by objective), cancel. The body of a
create is the sweep spec as JSON (what the CLI and SDK read from a native or AML v2 file,
or what HyperDriveConfig builds); a bad one is a 422 naming the field."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.orm import Session

from batchyard.server.auth import context
from batchyard.server.context import ServerContext
from batchyard.server.routers.deps import ClusterName, CommitRoute, ExperimentName, session
from batchyard.server.security.permissions import InWorkspace
from batchyard.server.security.principal import Principal, Role
from batchyard.server.services import sweeps
from batchyard.spec.errors import spec_error_from
from batchyard.spec.sweep import SweepSpec

router = APIRouter(tags=["sweeps"], route_class=CommitRoute)
READ = InWorkspace(Role.reader)
SWEEP = "/workspaces/{ws}/experiments/{exp}/sweeps/{name}"


class CreateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any]
    experiment: ExperimentName = None
    cluster: ClusterName = None
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,55}$")
    source_format: str = Field("native", min_length=1, max_length=16,
                               pattern=r"^[A-Za-z0-9_.-]+$")


@router.post("/workspaces/{ws}/sweeps", status_code=201)
def create(ws: str, body: CreateIn, s: Session = Depends(session),
           who: Principal = Depends(InWorkspace(
               Role.contributor, "sweep.create",
               target=lambda p, b: f"{b.get('experiment') or ''}/{b.get('name') or ''}")),
           ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    try:
        spec = SweepSpec.model_validate(body.spec)
    except ValidationError as exc:
        raise spec_error_from(exc, "sweep spec", model=SweepSpec) from None
    return sweeps.create(ctx, s, ws, spec, experiment=body.experiment, cluster=body.cluster,
                         name=body.name, source_format=body.source_format,
                         created_by=who.name)


@router.get("/workspaces/{ws}/sweeps", dependencies=[Depends(READ)])
def list_all(ws: str, experiment: str | None = None,
             s: Session = Depends(session)) -> list[dict[str, Any]]:
    return sweeps.list_all(s, ws, experiment)


@router.get(SWEEP, dependencies=[Depends(READ)])
def show(ws: str, exp: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    return sweeps.show(s, ws, exp, name)


@router.post(SWEEP + "/cancel", dependencies=[
    Depends(InWorkspace(Role.contributor, "sweep.cancel", own=True))])
def cancel(ws: str, exp: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    return sweeps.cancel(s, ws, exp, name)
