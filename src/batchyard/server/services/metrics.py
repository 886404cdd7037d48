"""Metrics and tags of a job. Ranks write them with their job-scoped token (a job token may
only touch its own job); the admin token reads and writes any job's.

A numeric value is stored as a float; lists, rows, tables, strings and non-finite numbers as
JSON (non-finite floats as ``{"$float": "nan" | "inf" | "-inf"}``, so every answer stays
valid JSON). A batch may carry an id: a client retrying a batch whose answer it lost is not
counted twice.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import Conflict, Forbidden, SpecError
from batchyard.server.auth import Principal
from batchyard.server.services.jobs import find
from batchyard.store.models import Experiment, Job, Metric, Workspace, now
from batchyard.store.specjson import spec_error

KINDS = ("scalar", "list", "row", "table")
MAX_BATCH = 10_000
MAX_VALUE_BYTES = 1024 * 1024
MAX_TAGS = 200
MAX_TAG_VALUE = 4096


def _job_for(session: Session, principal: Principal, workspace: str, experiment: str,
             name: str) -> Job:
    """The job named, for a user (the route's rule let them through); for a job token,
    its own job or 403, the same 403 whether the job named is another one or none at all
    (a job token must not learn which other workspaces, experiments and jobs exist)."""
    if principal.kind != "job":
        return find(session, workspace, experiment, name)
    own = session.get(Job, principal.job_id) if principal.job_id is not None else None
    if own is not None and own.name == name:
        exp = session.get(Experiment, own.experiment_id)
        ws = session.get(Workspace, own.workspace_id)
        if exp is not None and ws is not None and (ws.name, exp.name) == (workspace,
                                                                          experiment):
            return own
    raise Forbidden("a job token reaches only its own job's metrics and tags")


def encode_value(value: Any) -> tuple[float | None, Any]:
    """(float column, JSON column) for one logged value."""
    if isinstance(value, bool) or value is None:
        return None, value
    if isinstance(value, int | float):
        number = float(value)
        if math.isfinite(number):
            return number, None
        return None, {"$float": "nan" if math.isnan(number) else
                      ("inf" if number > 0 else "-inf")}
    if isinstance(value, list | dict):
        return None, _finite_json(value)
    return None, value


def _finite_json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return encode_value(value)[1]
    if isinstance(value, list):
        return [_finite_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _finite_json(v) for k, v in value.items()}
    return value


def post(session: Session, principal: Principal, workspace: str, experiment: str, name: str,
         items: list[dict[str, Any]], batch_id: str | None = None) -> dict[str, Any]:
    job = _job_for(session, principal, workspace, experiment, name)
    if len(items) > MAX_BATCH:
        raise SpecError(f"metrics: at most {MAX_BATCH} values per request")
    if batch_id and session.scalar(select(Metric.id).where(Metric.job_id == job.id,
                                                           Metric.batch_id == batch_id).limit(1)):
        return {"accepted": 0, "duplicate": True}
    stamp = now()
    for index, item in enumerate(items):
        kind = item.get("kind") or "scalar"
        if kind not in KINDS:
            raise SpecError(f"metrics[{index}].kind: use one of {', '.join(KINDS)}")
        value, data = encode_value(item.get("value"))
        if data is not None and len(json.dumps(data)) > MAX_VALUE_BYTES:
            raise SpecError(f"metrics[{index}].value: larger than {MAX_VALUE_BYTES // 1024} KiB")
        session.add(Metric(job_id=job.id, attempt=item.get("attempt") or job.attempt,
                           name=item["name"], kind=kind, value=value, data=data,
                           step=item.get("step"), rank=item.get("rank"),
                           ts=item.get("ts") or stamp, batch_id=batch_id))
    session.flush()
    if any(item.get("step") is not None and item.get("rank") is not None for item in items):
        from batchyard.server.services.stragglers import look

        look(session, job)
    return {"accepted": len(items), "duplicate": False}


def metric_dict(m: Metric) -> dict[str, Any]:
    return {"id": m.id, "name": m.name, "kind": m.kind,
            "value": m.value if m.value is not None else m.data, "step": m.step,
            "rank": m.rank, "attempt": m.attempt, "ts": m.ts}


PG_MAX_ID = 2**31 - 1


def list_metrics(session: Session, principal: Principal, workspace: str, experiment: str,
                 name: str, *, metric: str | None = None, attempt: int | None = None,
                 after: int | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Values in the order they were received; ``after`` (an id) gives only newer ones."""
    job = _job_for(session, principal, workspace, experiment, name)
    query = select(Metric).where(Metric.job_id == job.id)
    if metric is not None:
        query = query.where(Metric.name == metric)
    if attempt is not None:
        query = query.where(Metric.attempt == attempt)
    if after is not None:
        if after >= PG_MAX_ID and session.get_bind().dialect.name == "postgresql":
            return []  # ids are 32-bit there: none is greater (and the literal would overflow)
        query = query.where(Metric.id > after)
    query = query.order_by(Metric.id)
    if limit is not None:
        query = query.limit(limit)
    return [metric_dict(m) for m in session.scalars(query)]


def get_tags(session: Session, principal: Principal, workspace: str, experiment: str,
             name: str) -> dict[str, str]:
    job = _job_for(session, principal, workspace, experiment, name)
    return dict(job.spec.get("tags") or {})


def set_tags(session: Session, principal: Principal, workspace: str, experiment: str,
             name: str, tags: dict[str, str | None]) -> dict[str, str]:
    """Merge ``tags`` into the job's tags; a None value removes that tag."""
    job = _job_for(session, principal, workspace, experiment, name)
    unread = spec_error(job.spec)
    if unread:  # writing tags would replace what is stored with an empty spec
        raise Conflict(f"job {name!r}: its stored spec cannot be read ({unread}); "
                       "tags are not stored")
    merged: dict[str, str] = dict(job.spec.get("tags") or {})
    for key, value in tags.items():
        if not key or len(key) > 255:
            raise SpecError("tags: a tag name must have 1 to 255 characters")
        if value is None:
            merged.pop(key, None)
        elif len(value) > MAX_TAG_VALUE:
            raise SpecError(f"tags.{key}: longer than {MAX_TAG_VALUE} characters")
        else:
            merged[key] = value
    if len(merged) > MAX_TAGS:
        raise SpecError(f"tags: at most {MAX_TAGS} tags per job")
    job.spec = {**job.spec, "tags": merged}  # a new dict, so the JSON column is rewritten
    session.flush()
    return merged
