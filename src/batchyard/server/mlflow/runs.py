"""Experiments and runs as MLflow sees them. A job token acts for its own job's run only: it
finds its own experiment, any run it creates is its job (every rank, every ``start_run`` and
autolog's child runs log to the one job, as on Azure ML), and any other run id is refused
with the same answer whether or not it exists. The admin token reads every run; runs are
made by submitting jobs, not through MLflow."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from batchyard.server.auth import Principal
from batchyard.server.mlflow import ids
from batchyard.server.mlflow.errors import MlflowError, invalid, not_found
from batchyard.server.services import common
from batchyard.server.services.metrics import MAX_TAG_VALUE, MAX_TAGS, encode_value
from batchyard.store.db import begin_write, is_sqlite
from batchyard.store.models import Experiment, Job, Metric, Workspace, now

MAX_PARAMS = 2000
MAX_PARAM_VALUE = 6000
MAX_KEY = 250
BATCH_METRICS, BATCH_PARAMS, BATCH_TAGS = 1000, 100, 100
STATUS = {"queued": "SCHEDULED", "preparing": "SCHEDULED", "running": "RUNNING",
          "finalizing": "RUNNING", "succeeded": "FINISHED", "failed": "FAILED",
          "canceled": "KILLED"}


def ms(seconds: float | None) -> int | None:
    """MLflow's milliseconds; a time no client could have meant (a row stored before the
    metrics route bounded ``ts``) reads as 0 rather than failing the whole run."""
    if seconds is None:
        return None
    stamp = seconds * 1000
    return int(stamp) if math.isfinite(stamp) and abs(stamp) < 2 ** 63 else 0


def denied() -> MlflowError:
    return MlflowError("PERMISSION_DENIED", "a job token reaches only its own job's MLflow "
                       "run and experiment")


# --- experiments ---------------------------------------------------------------------------

def experiment_dict(exp: Experiment) -> dict[str, Any]:
    return {"experiment_id": str(exp.id), "name": exp.name,
            "artifact_location": f"mlflow-artifacts:/{exp.id}", "lifecycle_stage": "active",
            "creation_time": ms(exp.created_at), "last_update_time": ms(exp.created_at),
            "tags": []}


def own_job(session: Session, principal: Principal) -> Job:
    job = session.get(Job, principal.job_id) if principal.job_id is not None else None
    if job is None:
        raise denied()
    return job


def _default_workspace(session: Session) -> Workspace:
    return common.workspace(session, common.DEFAULT)


def experiment_by_name(session: Session, principal: Principal, name: str) -> dict[str, Any]:
    if not principal.admin:
        own = session.get(Experiment, own_job(session, principal).experiment_id)
        if own is None or own.name != name:
            raise not_found(f"Could not find experiment with name '{name}'")
        return {"experiment": experiment_dict(own)}
    ws = _default_workspace(session)
    exp = session.scalar(select(Experiment).where(Experiment.workspace_id == ws.id,
                                                  Experiment.name == name))
    if exp is None:
        raise not_found(f"Could not find experiment with name '{name}'")
    return {"experiment": experiment_dict(exp)}


def experiment(session: Session, principal: Principal, experiment_id: str) -> dict[str, Any]:
    number = ids.experiment_id(experiment_id)
    if not principal.admin and number != own_job(session, principal).experiment_id:
        raise not_found(f"No experiment with id={experiment_id} exists")
    exp = session.get(Experiment, number) if number is not None else None
    if exp is None:
        raise not_found(f"No experiment with id={experiment_id} exists")
    return {"experiment": experiment_dict(exp)}


def create_experiment(session: Session, principal: Principal, name: str) -> dict[str, Any]:
    """A job's runs live in its own experiment: a job token asking for another one (a
    script's ``mlflow.set_experiment``) gets its own, as Azure ML jobs do."""
    if not principal.admin:
        return {"experiment_id": str(own_job(session, principal).experiment_id)}
    ws = _default_workspace(session)
    if session.scalar(select(Experiment.id).where(Experiment.workspace_id == ws.id,
                                                  Experiment.name == name)):
        raise MlflowError("RESOURCE_ALREADY_EXISTS", f"Experiment '{name}' already exists.")
    try:
        common.check_name("experiment", name)
    except Exception as exc:
        raise invalid(str(getattr(exc, "message", exc))) from None
    exp = Experiment(workspace_id=ws.id, name=name)
    session.add(exp)
    session.flush()
    return {"experiment_id": str(exp.id)}


def search_experiments(session: Session, principal: Principal) -> dict[str, Any]:
    if not principal.admin:
        own = session.get(Experiment, own_job(session, principal).experiment_id)
        return {"experiments": [experiment_dict(own)] if own is not None else []}
    ws = _default_workspace(session)
    rows = session.scalars(select(Experiment).where(Experiment.workspace_id == ws.id)
                           .order_by(Experiment.id))
    return {"experiments": [experiment_dict(e) for e in rows]}


# --- runs ----------------------------------------------------------------------------------

def job_of_run(session: Session, principal: Principal, run: str | None,
               *, write: bool = False) -> Job:
    """The job a run id names, for this principal (a job token: its own, else refused)."""
    if not run:
        raise invalid("run_id: required")
    if not principal.admin:
        job = own_job(session, principal)
        if run != ids.run_id(job):
            raise denied()
    else:
        number = ids.job_id_of_run(run)
        found = session.get(Job, number) if number is not None else None
        if found is None or ids.run_id(found) != run:
            raise not_found(f"Run with id={run} not found")
        job = found
    if write:
        lock(session, job)
    return job


def lock(session: Session, job: Job) -> None:
    """Params and tags are read, merged and written back: one writer at a time."""
    if is_sqlite(session):
        begin_write(session)
        session.refresh(job)
    else:
        session.refresh(job, with_for_update=True)


def _latest_metrics(session: Session, job: Job) -> list[dict[str, Any]]:
    last = (select(func.max(Metric.id)).where(Metric.job_id == job.id,
                                              Metric.kind == "scalar")
            .group_by(Metric.name))
    rows = session.scalars(select(Metric).where(Metric.id.in_(last)).order_by(Metric.name))
    return [metric_dict(m) for m in rows]


def metric_dict(m: Metric) -> dict[str, Any]:
    value: Any = m.value
    if value is None:
        special = m.data.get("$float") if isinstance(m.data, dict) else None
        value = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(str(special), "NaN")
    return {"key": m.name, "value": value, "timestamp": ms(m.ts), "step": m.step or 0}


def run_info(session: Session, job: Job) -> dict[str, Any]:
    info: dict[str, Any] = {
        "run_id": ids.run_id(job), "run_uuid": ids.run_id(job),
        "experiment_id": str(job.experiment_id), "run_name": job.name,
        "user_id": job.created_by or "", "status": STATUS.get(job.state, "RUNNING"),
        "start_time": ms(job.started_at or job.submitted_at),
        "lifecycle_stage": "active"}
    if job.ended_at is not None:
        info["end_time"] = ms(job.ended_at)
    info["artifact_uri"] = f"mlflow-artifacts:/{job.experiment_id}/{info['run_id']}/artifacts"
    return info


def run_dict(session: Session, job: Job) -> dict[str, Any]:
    tags = dict((job.spec or {}).get("tags") or {})
    tags.setdefault("mlflow.runName", job.name)
    data = {"metrics": _latest_metrics(session, job),
            "params": [{"key": k, "value": v} for k, v in sorted((job.params or {}).items())],
            "tags": [{"key": k, "value": v} for k, v in sorted(tags.items())]}
    return {"info": run_info(session, job), "data": data,
            "inputs": {"dataset_inputs": list((job.mlflow or {}).get("inputs") or [])}}


def create_run(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    if principal.admin:
        raise invalid("a run is a batchyard job: submit a job (its ranks log to its run with "
                      "their job token, MLFLOW_TRACKING_TOKEN)")
    job = own_job(session, principal)
    lock(session, job)
    set_tags(job, _pairs(body.get("tags"), "tags"))
    session.flush()
    return {"run": run_dict(session, job)}


def get_run(session: Session, principal: Principal, run: str) -> dict[str, Any]:
    return {"run": run_dict(session, job_of_run(session, principal, run))}


def update_run(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    """The run's status is the job's (set by batchyard); a script ending its run changes
    nothing else."""
    job = job_of_run(session, principal, body.get("run_id") or body.get("run_uuid"))
    return {"run_info": run_info(session, job)}


def search_runs(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    if body.get("filter") or body.get("filter_string"):
        raise invalid("runs/search: filters are not supported by batchyard's tracking "
                      "server; list the runs of an experiment without one")
    given = body.get("experiment_ids") or []
    if not isinstance(given, list):
        raise invalid("experiment_ids: a list of experiment ids")
    wanted = {ids.experiment_id(e) for e in given if isinstance(e, str | int)}
    if not principal.admin:
        job = own_job(session, principal)
        return {"runs": [run_dict(session, job)] if job.experiment_id in wanted else []}
    most = body.get("max_results") or 1000
    if not isinstance(most, int) or isinstance(most, bool):
        raise invalid("max_results: a whole number")
    limit = max(1, min(most, 1000))
    jobs = session.scalars(select(Job).where(Job.experiment_id.in_(
        [w for w in wanted if w is not None])).order_by(Job.id.desc()).limit(limit))
    return {"runs": [run_dict(session, j) for j in jobs]}


# --- what a run logs -----------------------------------------------------------------------

def _pairs(items: Any, field: str) -> dict[str, str]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise invalid(f"{field}: a list of {{key, value}}")
    out: dict[str, str] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise invalid(f"{field}[{index}]: a {{key, value}} with a string key")
        value = item.get("value")
        out[item["key"]] = "" if value is None else str(value)
    return out


def _check_key(key: str, field: str) -> None:
    if not key or len(key) > MAX_KEY or "\x00" in key:
        raise invalid(f"{field}: a key of 1 to {MAX_KEY} characters, got {key[:40]!r}")


def set_tags(job: Job, tags: Mapping[str, str | None]) -> None:
    merged = dict((job.spec or {}).get("tags") or {})
    for key, value in tags.items():
        _check_key(key, "tags")
        if value is None:
            merged.pop(key, None)
        elif len(value) > MAX_TAG_VALUE or "\x00" in value:
            raise invalid(f"tags.{key}: at most {MAX_TAG_VALUE} characters")
        else:
            merged[key] = value
    if len(merged) > MAX_TAGS:
        raise invalid(f"tags: at most {MAX_TAGS} tags per run")
    if merged != ((job.spec or {}).get("tags") or {}):
        job.spec = {**job.spec, "tags": merged}


def set_params(job: Job, params: dict[str, str]) -> None:
    """A param logged again takes its new value (a retried attempt may log another)."""
    merged = dict(job.params or {})
    for key, value in params.items():
        _check_key(key, "params")
        if len(value) > MAX_PARAM_VALUE or "\x00" in value:
            raise invalid(f"params.{key}: at most {MAX_PARAM_VALUE} characters")
        merged[key] = value
    if len(merged) > MAX_PARAMS:
        raise invalid(f"params: at most {MAX_PARAMS} params per run")
    if merged != (job.params or {}):
        job.params = merged


def _metric_value(value: Any, key: str) -> float:
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity", "nan", "inf",
                                            "-inf"):
        return float(value.lower().replace("infinity", "inf"))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"metrics.{key}: value must be a number")
    try:
        return float(value)
    except OverflowError:
        raise invalid(f"metrics.{key}: a number too large to store") from None


def _seconds(stamp_ms: Any, default: float) -> float:
    """MLflow's timestamp (ms since the epoch) in seconds; ``default`` when unusable."""
    if isinstance(stamp_ms, bool) or not isinstance(stamp_ms, int | float):
        return default
    try:
        seconds = float(stamp_ms) / 1000
    except OverflowError:
        return default
    return seconds if math.isfinite(seconds) and 0 < seconds < 1e11 else default


def add_metrics(session: Session, job: Job, items: list[dict[str, Any]]) -> None:
    stamp = now()
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise invalid(f"metrics[{index}]: a {{key, value, timestamp, step}}")
        key = item["key"]
        _check_key(key, "metrics")
        value, data = encode_value(_metric_value(item.get("value"), key))
        step = item.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)
                                 or not 0 <= step < 2**31):
            raise invalid(f"metrics.{key}: step must be a whole number from 0 to 2^31-1")
        session.add(Metric(job_id=job.id, attempt=job.attempt, name=key, kind="scalar",
                           value=value, data=data, step=step, rank=None,
                           ts=_seconds(item.get("timestamp"), stamp)))


def log_metric(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    job = job_of_run(session, principal, body.get("run_id") or body.get("run_uuid"))
    add_metrics(session, job, [body])
    return {}


def log_batch(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    metrics, params, tags = (body.get(k) or [] for k in ("metrics", "params", "tags"))
    for name, items, limit in (("metrics", metrics, BATCH_METRICS),
                               ("params", params, BATCH_PARAMS), ("tags", tags, BATCH_TAGS)):
        if not isinstance(items, list):
            raise invalid(f"{name}: a list")
        if len(items) > limit:
            raise invalid(f"{name}: at most {limit} per batch")
    write = bool(params or tags)
    job = job_of_run(session, principal, body.get("run_id"), write=write)
    add_metrics(session, job, metrics)
    if params:
        set_params(job, _pairs(params, "params"))
    if tags:
        set_tags(job, _pairs(tags, "tags"))
    return {}


def log_param(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    job = job_of_run(session, principal, body.get("run_id") or body.get("run_uuid"),
                     write=True)
    set_params(job, _pairs([body], "params"))
    return {}


def set_tag(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    job = job_of_run(session, principal, body.get("run_id") or body.get("run_uuid"),
                     write=True)
    set_tags(job, dict(_pairs([body], "tags")))
    return {}


def delete_tag(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    job = job_of_run(session, principal, body.get("run_id"), write=True)
    key = body.get("key")
    if not isinstance(key, str) or key not in ((job.spec or {}).get("tags") or {}):
        raise not_found(f"No tag with name: {key} in run with id {body.get('run_id')}")
    set_tags(job, {key: None})
    return {}


def log_inputs(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    """Datasets a run used (autolog sends them): their name, digest and source type."""
    job = job_of_run(session, principal, body.get("run_id"), write=True)
    state = dict(job.mlflow or {})
    inputs = list(state.get("inputs") or [])
    for entry in body.get("datasets") or []:
        dataset = (entry or {}).get("dataset") if isinstance(entry, dict) else None
        if not isinstance(dataset, dict):
            continue
        kept = {k: str(dataset[k])[:500] for k in ("name", "digest", "source_type")
                if dataset.get(k) is not None}
        item = {"tags": [t for t in entry.get("tags") or [] if isinstance(t, dict)][:10],
                "dataset": kept}
        if item not in inputs and len(inputs) < 100:
            inputs.append(item)
    state["inputs"] = inputs
    job.mlflow = state
    return {}


def metric_history(session: Session, principal: Principal, run: str, key: str,
                   max_results: int | None) -> dict[str, Any]:
    job = job_of_run(session, principal, run)
    query = (select(Metric).where(Metric.job_id == job.id, Metric.name == key,
                                  Metric.kind == "scalar").order_by(Metric.id))
    if max_results:
        query = query.limit(max(1, min(max_results, 100_000)))
    return {"metrics": [metric_dict(m) for m in session.scalars(query)]}
