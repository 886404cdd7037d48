"""Metrics and tags of a job. Open to job-scoped tokens on their own job (ranks log through
them), as each route's rule says."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.orm import Session

from batchyard.server.routers.deps import INT32_MAX, INT64_MAX, CommitRoute, session
from batchyard.server.security.permissions import InWorkspace
from batchyard.server.security.principal import Principal, Role
from batchyard.server.services import metrics

router = APIRouter(tags=["metrics"], route_class=CommitRoute)
JOB = "/workspaces/{ws}/experiments/{exp}/jobs/{name}"
READ = InWorkspace(Role.reader, jobs=True)


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL byte")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]


def _numbers_fit(value: Any) -> Any:
    """Every int in a value must be one a float holds (scalars are stored as floats)."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            raise ValueError("a number too large to store") from None
    elif isinstance(value, list):
        for item in value:
            _numbers_fit(item)
    elif isinstance(value, dict):
        for item in value.values():
            _numbers_fit(item)
    return value


class MetricIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Text = Field(min_length=1, max_length=255)
    value: Any = None
    kind: Literal["scalar", "list", "row", "table"] = "scalar"
    step: int | None = Field(None, ge=0, le=INT32_MAX)
    rank: int | None = Field(None, ge=0, le=INT32_MAX)
    attempt: int | None = Field(None, ge=1, le=INT32_MAX)
    # seconds since the epoch, up to the year 5138: a time every reader can turn into ms
    ts: float | None = Field(None, ge=0, le=1e11, allow_inf_nan=False)

    @field_validator("value")
    @classmethod
    def _value(cls, value: Any) -> Any:
        return _numbers_fit(value)


class MetricsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metrics: list[MetricIn] = Field(max_length=metrics.MAX_BATCH)
    batch: str | None = Field(None, max_length=64, description="Client batch id (retries).")


class TagsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tags: dict[Text, Text | None]


@router.post(JOB + "/metrics", status_code=201)
def post(ws: str, exp: str, name: str, body: MetricsIn,
         principal: Principal = Depends(InWorkspace(Role.contributor, "job.metrics", own=True,
                                                    jobs=True)),
         s: Session = Depends(session)) -> dict[str, Any]:
    items = [m.model_dump() for m in body.metrics]
    return metrics.post(s, principal, ws, exp, name, items, body.batch)


@router.get(JOB + "/metrics")
def list_all(ws: str, exp: str, name: str, metric: str | None = None,
             attempt: int | None = Query(None, ge=1, le=INT32_MAX),
             after: int | None = Query(None, ge=0, le=INT64_MAX,
                                       description="Only values with a greater id"),
             limit: int | None = Query(None, ge=1, le=100_000),
             principal: Principal = Depends(READ),
             s: Session = Depends(session)) -> list[dict[str, Any]]:
    return metrics.list_metrics(s, principal, ws, exp, name, metric=metric, attempt=attempt,
                                after=after, limit=limit)


@router.get(JOB + "/tags")
def get_tags(ws: str, exp: str, name: str, principal: Principal = Depends(READ),
             s: Session = Depends(session)) -> dict[str, str]:
    return metrics.get_tags(s, principal, ws, exp, name)


@router.post(JOB + "/tags")
def set_tags(ws: str, exp: str, name: str, body: TagsIn,
             principal: Principal = Depends(InWorkspace(Role.contributor, "job.tags", own=True,
                                                        jobs=True)),
             s: Session = Depends(session)) -> dict[str, str]:
    return metrics.set_tags(s, principal, ws, exp, name, body.tags)
