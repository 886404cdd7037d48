"""MLflow 3's logged models (``mlflow.<flavor>.log_model``, which autolog calls): kept with
the job that logged them (``jobs.mlflow``), their files among the job's outputs
(``outputs/mlflow-models/<model id>/``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from batchyard.server.auth import Principal
from batchyard.server.mlflow import ids, runs
from batchyard.server.mlflow.errors import invalid, not_found
from batchyard.store.models import Job, now

MAX_MODELS = 200
STATUSES = ("LOGGED_MODEL_PENDING", "LOGGED_MODEL_READY", "LOGGED_MODEL_UPLOAD_FAILED")


def _models(job: Job) -> dict[str, dict[str, Any]]:
    return dict((job.mlflow or {}).get("models") or {})


def _save(job: Job, models: dict[str, dict[str, Any]]) -> None:
    job.mlflow = {**(job.mlflow or {}), "models": models}


def model_dict(job: Job, model_id: str, model: dict[str, Any]) -> dict[str, Any]:
    info = {"model_id": model_id, "experiment_id": str(job.experiment_id),
            "name": model.get("name") or "model", "source_run_id": ids.run_id(job),
            "creation_timestamp_ms": model.get("created"),
            "last_updated_timestamp_ms": model.get("updated"),
            "artifact_uri": f"mlflow-artifacts:/{job.experiment_id}/models/{model_id}/artifacts",
            "status": model.get("status") or STATUSES[0], "lifecycle_stage": "active",
            "tags": [{"key": k, "value": v} for k, v in sorted((model.get("tags") or {})
                                                               .items())]}
    if model.get("model_type"):
        info["model_type"] = model["model_type"]
    return {"info": info, "data": {"params": [{"key": k, "value": v} for k, v in sorted(
        (model.get("params") or {}).items())], "metrics": []}}


def job_of_model(session: Session, principal: Principal, model_id: str,
                 *, write: bool = False) -> tuple[Job, dict[str, Any]]:
    number = ids.job_id_of_model(model_id)
    if not principal.admin and number != principal.job_id:
        raise runs.denied()
    job = session.get(Job, number) if number is not None else None
    if job is None or model_id not in _models(job):
        raise not_found(f"Logged model with id={model_id} not found")
    if write:
        runs.job_of_run(session, principal, ids.run_id(job), write=True)
    return job, _models(job)[model_id]


def create(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    source = body.get("source_run_id")
    if source:
        job = runs.job_of_run(session, principal, str(source), write=True)
    elif principal.admin:
        raise invalid("source_run_id: a logged model belongs to a run (a job)")
    else:
        job = runs.own_job(session, principal)
        runs.lock(session, job)
    models = _models(job)
    if len(models) >= MAX_MODELS:
        raise invalid(f"at most {MAX_MODELS} logged models per job")
    stamp = int(now() * 1000)
    model_id = ids.new_model_id(job)
    model = {"name": str(body.get("name") or "model")[:250], "created": stamp,
             "updated": stamp, "status": STATUSES[0],
             "params": runs._pairs(body.get("params"), "params"),
             "tags": runs._pairs(body.get("tags"), "tags"),
             "model_type": str(body.get("model_type") or "")[:100]}
    models[model_id] = model
    _save(job, models)
    return {"model": model_dict(job, model_id, model)}


def get(session: Session, principal: Principal, model_id: str) -> dict[str, Any]:
    job, model = job_of_model(session, principal, model_id)
    return {"model": model_dict(job, model_id, model)}


def update(session: Session, principal: Principal, model_id: str,
           body: dict[str, Any]) -> dict[str, Any]:
    """Finalize (its status) and tags or params added."""
    job, model = job_of_model(session, principal, model_id, write=True)
    model = dict(model)
    status = body.get("status")
    if status is not None:
        if status not in STATUSES:
            raise invalid(f"status: one of {', '.join(STATUSES)}")
        model["status"] = status
    if body.get("tags") is not None:
        model["tags"] = {**(model.get("tags") or {}), **runs._pairs(body["tags"], "tags")}
    if body.get("params") is not None:
        model["params"] = {**(model.get("params") or {}),
                           **runs._pairs(body["params"], "params")}
    model["updated"] = int(now() * 1000)
    _save(job, {**_models(job), model_id: model})
    return {"model": model_dict(job, model_id, model)}


def delete_tag(session: Session, principal: Principal, model_id: str,
               key: str) -> dict[str, Any]:
    job, model = job_of_model(session, principal, model_id, write=True)
    model = {**model, "tags": {k: v for k, v in (model.get("tags") or {}).items()
                               if k != key}}
    _save(job, {**_models(job), model_id: model})
    return {}


def search(session: Session, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    if not principal.admin:
        job = session.get(Job, principal.job_id)
        jobs = [job] if job is not None else []
    else:
        jobs = []
    wanted = {str(e) for e in body.get("experiment_ids") or []}
    found = [model_dict(j, mid, m) for j in jobs for mid, m in _models(j).items()
             if not wanted or str(j.experiment_id) in wanted]
    return {"models": found}
