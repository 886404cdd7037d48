from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server.auth import require_admin
from batchyard.server.routers.deps import INT32_MAX, CommitRoute, session
from batchyard.server.services import quotas

router = APIRouter(tags=["quotas"], dependencies=[Depends(require_admin)],
                   route_class=CommitRoute)


class QuotaIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    family: str = Field(min_length=1, max_length=64)
    vcpus: int | None = Field(None, ge=0, le=INT32_MAX)
    gpus: int | None = Field(None, ge=0, le=INT32_MAX)


@router.get("/workspaces/{ws}/usage")
def usage(ws: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return quotas.usage(s, ws)


@router.put("/workspaces/{ws}/quotas")
def set_quota(ws: str, body: QuotaIn, s: Session = Depends(session)) -> dict[str, Any]:
    return quotas.set_quota(s, ws, body.family, body.vcpus, body.gpus)
