"""Teams' guaranteed capacity on a cluster (issue 35 §2, `batchyard cluster quota`):
set and removed by a server admin (they decide between teams), listed by the workspace's
readers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server.routers.deps import INT32_MAX, CommitRoute, session
from batchyard.server.security.permissions import Admin, InWorkspace
from batchyard.server.security.principal import Role
from batchyard.server.services import guarantees

router = APIRouter(tags=["guarantees"], route_class=CommitRoute)
PATH = "/workspaces/{ws}/clusters/{name}/guarantees"


class GuaranteeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: int | None = Field(None, ge=0, le=INT32_MAX, description="GPUs guaranteed (a "
                             "whole number of nodes' worth); or give nodes.")
    nodes: int | None = Field(None, ge=0, le=INT32_MAX, description="Nodes guaranteed.")
    borrow_limit: int | None = Field(None, ge=0, le=INT32_MAX, description="How much the "
                                     "team may use beyond its guarantee, in the same unit; "
                                     "none: no limit.")


@router.get(PATH, dependencies=[Depends(InWorkspace(Role.reader))])
def list_guarantees(ws: str, name: str, s: Session = Depends(session)
                    ) -> list[dict[str, Any]]:
    return guarantees.guarantees(s, ws, name)


@router.put(PATH + "/{team}", dependencies=[Depends(Admin("guarantee.set"))])
def set_guarantee(ws: str, name: str, team: str, body: GuaranteeIn,
                  s: Session = Depends(session)) -> dict[str, Any]:
    return guarantees.set_guarantee(s, ws, name, team, body.gpus, body.nodes,
                                    body.borrow_limit)


@router.delete(PATH + "/{team}", dependencies=[Depends(Admin("guarantee.remove"))])
def remove_guarantee(ws: str, name: str, team: str, s: Session = Depends(session)
                     ) -> dict[str, Any]:
    return guarantees.remove_guarantee(s, ws, name, team)
