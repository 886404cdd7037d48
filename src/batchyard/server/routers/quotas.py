from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server.routers.deps import INT32_MAX, CommitRoute, session
from batchyard.server.security.permissions import Admin, InWorkspace
from batchyard.server.security.principal import Role
from batchyard.server.services import quotas

router = APIRouter(tags=["quotas"], route_class=CommitRoute)


class QuotaIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    family: str = Field(min_length=1, max_length=64)
    vcpus: int | None = Field(None, ge=0, le=INT32_MAX)
    gpus: int | None = Field(None, ge=0, le=INT32_MAX)


@router.get("/workspaces/{ws}/usage", dependencies=[Depends(InWorkspace(Role.reader))])
def usage(ws: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return quotas.usage(s, ws)


@router.put("/workspaces/{ws}/quotas", dependencies=[Depends(Admin(
    "quota.set", target=lambda p, b: b.get("family")))])
def set_quota(ws: str, body: QuotaIn, s: Session = Depends(session)) -> dict[str, Any]:
    return quotas.set_quota(s, ws, body.family, body.vcpus, body.gpus)
