"""Metrics and tags of a job. Open to job-scoped tokens (ranks log through them); the
service checks that a job token only reaches its own job."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server.auth import Principal, require_any
from batchyard.server.routers.deps import CommitRoute, session
from batchyard.server.services import metrics

router = APIRouter(tags=["metrics"], route_class=CommitRoute)
JOB = "/workspaces/{ws}/experiments/{exp}/jobs/{name}"


class MetricIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=255)
    value: Any = None
    kind: Literal["scalar", "list", "row", "table"] = "scalar"
    step: int | None = Field(None, ge=0)
    rank: int | None = Field(None, ge=0)
    attempt: int | None = Field(None, ge=1)
    ts: float | None = None


class MetricsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metrics: list[MetricIn] = Field(max_length=metrics.MAX_BATCH)
    batch: str | None = Field(None, max_length=64, description="Client batch id (retries).")


class TagsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tags: dict[str, str | None]


@router.post(JOB + "/metrics", status_code=201)
def post(ws: str, exp: str, name: str, body: MetricsIn,
         principal: Principal = Depends(require_any),
         s: Session = Depends(session)) -> dict[str, Any]:
    items = [m.model_dump() for m in body.metrics]
    return metrics.post(s, principal, ws, exp, name, items, body.batch)


@router.get(JOB + "/metrics")
def list_all(ws: str, exp: str, name: str, metric: str | None = None,
             attempt: int | None = None, after: int | None = None,
             limit: int | None = Query(None, ge=1, le=100_000),
             principal: Principal = Depends(require_any),
             s: Session = Depends(session)) -> list[dict[str, Any]]:
    return metrics.list_metrics(s, principal, ws, exp, name, metric=metric, attempt=attempt,
                                after=after, limit=limit)


@router.get(JOB + "/tags")
def get_tags(ws: str, exp: str, name: str, principal: Principal = Depends(require_any),
             s: Session = Depends(session)) -> dict[str, str]:
    return metrics.get_tags(s, principal, ws, exp, name)


@router.post(JOB + "/tags")
def set_tags(ws: str, exp: str, name: str, body: TagsIn,
             principal: Principal = Depends(require_any),
             s: Session = Depends(session)) -> dict[str, str]:
    return metrics.set_tags(s, principal, ws, exp, name, body.tags)
