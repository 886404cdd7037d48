from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server.routers.deps import CommitRoute, session
from batchyard.server.security.permissions import Admin, InWorkspace, SignedIn
from batchyard.server.security.principal import Principal, Role
from batchyard.server.services import workspaces

router = APIRouter(tags=["workspaces"], route_class=CommitRoute)


class WorkspaceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=64)  # the service says what a name may be
    location: str | None = Field(None, max_length=64, pattern=r"^[^\x00]*$")
    subscription_id: str | None = Field(None, max_length=128, pattern=r"^[^\x00]*$")
    resource_group: str | None = Field(None, max_length=128, pattern=r"^[^\x00]*$")
    exist_ok: bool = False


@router.post("/workspaces", status_code=201)
def create(body: WorkspaceIn, s: Session = Depends(session),
           who: Principal = Depends(Admin("workspace.create",
                                          target=lambda p, b: b.get("name")))
           ) -> dict[str, Any]:
    """Its maker becomes its first owner."""
    return workspaces.create(s, body.name, body.location, body.subscription_id,
                             body.resource_group, exist_ok=body.exist_ok,
                             owner=(who.user_id, who.name))


class WorkspaceUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mlflow_uri: str | None = Field(None, max_length=2048,
                                   description="An external MLflow tracking server its jobs "
                                   "log to ('' for batchyard's own).")


@router.patch("/workspaces/{ws}",
              dependencies=[Depends(InWorkspace(Role.owner, "workspace.update"))])
def update(ws: str, body: WorkspaceUpdate, s: Session = Depends(session)) -> dict[str, Any]:
    return workspaces.update(s, ws, mlflow_uri=body.mlflow_uri)


@router.get("/workspaces")
def list_all(s: Session = Depends(session),
             who: Principal = Depends(SignedIn())) -> list[dict[str, Any]]:
    """The workspaces the caller has a role in (an admin: every one)."""
    return [w for w in workspaces.list_all(s) if who.visible(w["name"])]


@router.get("/workspaces/{ws}", dependencies=[Depends(InWorkspace(Role.reader))])
def show(ws: str, s: Session = Depends(session)) -> dict[str, Any]:
    return workspaces.show(s, ws)


@router.delete("/workspaces/{ws}", status_code=204,
               dependencies=[Depends(Admin("workspace.delete"))])
def delete(ws: str, s: Session = Depends(session)) -> Response:
    workspaces.delete(s, ws)
    return Response(status_code=204)
