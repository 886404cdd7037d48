"""The routes of MLflow's tracking API (``/api/2.0/mlflow/...``) and of its artifacts proxy
(``/api/2.0/mlflow-artifacts/...``), at the server's root, where ``MLFLOW_TRACKING_URI`` (the
server's URL) sends the ``mlflow`` client. Admin token or a job token (a job's ranks); every
error in MLflow's shape; a call not implemented here is ``ENDPOINT_NOT_FOUND``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI, Query, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from batchyard.server.auth import Principal, server_context
from batchyard.server.mlflow import artifacts, models, runs
from batchyard.server.mlflow.errors import MlflowRoute, endpoint_not_found, invalid
from batchyard.server.routers.deps import session
from batchyard.server.routers.downloads import download_response
from batchyard.server.security.permissions import AdminOrJob

API = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
TRACKING = AdminOrJob()
router = APIRouter(tags=["mlflow"], route_class=MlflowRoute,
                   dependencies=[Depends(TRACKING)])  # (one check: FastAPI caches it)
Auth = Depends(TRACKING)
JsonBody = Body(default_factory=dict)


def install(app: FastAPI) -> None:
    app.include_router(router)


# --- experiments ---------------------------------------------------------------------------

@router.get(API + "/experiments/get-by-name")
def experiment_by_name(experiment_name: str = Query(min_length=1, max_length=256),
                       principal: Principal = Auth,
                       s: Session = Depends(session)) -> dict[str, Any]:
    return runs.experiment_by_name(s, principal, experiment_name)


@router.get(API + "/experiments/get")
def experiment(experiment_id: str = Query(max_length=32), principal: Principal = Auth,
               s: Session = Depends(session)) -> dict[str, Any]:
    return runs.experiment(s, principal, experiment_id)


@router.post(API + "/experiments/create")
def create_experiment(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
                      s: Session = Depends(session)) -> dict[str, Any]:
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("name: required")
    return runs.create_experiment(s, principal, name)


@router.api_route(API + "/experiments/search", methods=["GET", "POST"])
def search_experiments(principal: Principal = Auth,
                       s: Session = Depends(session)) -> dict[str, Any]:
    return runs.search_experiments(s, principal)


# --- runs ----------------------------------------------------------------------------------

@router.post(API + "/runs/create")
def create_run(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
               s: Session = Depends(session)) -> dict[str, Any]:
    return runs.create_run(s, principal, body)


@router.get(API + "/runs/get")
def get_run(run_id: str | None = Query(None, max_length=64),
            run_uuid: str | None = Query(None, max_length=64), principal: Principal = Auth,
            s: Session = Depends(session)) -> dict[str, Any]:
    return runs.get_run(s, principal, run_id or run_uuid or "")


@router.post(API + "/runs/update")
def update_run(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
               s: Session = Depends(session)) -> dict[str, Any]:
    return runs.update_run(s, principal, body)


@router.post(API + "/runs/search")
def search_runs(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
                s: Session = Depends(session)) -> dict[str, Any]:
    return runs.search_runs(s, principal, body)


@router.post(API + "/runs/log-metric")
def log_metric(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
               s: Session = Depends(session)) -> dict[str, Any]:
    return runs.log_metric(s, principal, body)


@router.post(API + "/runs/log-batch")
def log_batch(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
              s: Session = Depends(session)) -> dict[str, Any]:
    return runs.log_batch(s, principal, body)


@router.post(API + "/runs/log-parameter")
def log_param(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
              s: Session = Depends(session)) -> dict[str, Any]:
    return runs.log_param(s, principal, body)


@router.post(API + "/runs/set-tag")
def set_tag(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
            s: Session = Depends(session)) -> dict[str, Any]:
    return runs.set_tag(s, principal, body)


@router.post(API + "/runs/delete-tag")
def delete_tag(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
               s: Session = Depends(session)) -> dict[str, Any]:
    return runs.delete_tag(s, principal, body)


@router.post(API + "/runs/log-inputs")
def log_inputs(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
               s: Session = Depends(session)) -> dict[str, Any]:
    return runs.log_inputs(s, principal, body)


@router.post(API + "/runs/outputs")
def log_outputs(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
                s: Session = Depends(session)) -> dict[str, Any]:
    runs.job_of_run(s, principal, body.get("run_id"))  # the models are kept with the job
    return {}


@router.get(API + "/metrics/get-history")
def metric_history(run_id: str | None = Query(None, max_length=64),
                   run_uuid: str | None = Query(None, max_length=64),
                   metric_key: str = Query(min_length=1, max_length=250),
                   max_results: int | None = Query(None, ge=1, le=2**31 - 1),
                   principal: Principal = Auth,
                   s: Session = Depends(session)) -> dict[str, Any]:
    return runs.metric_history(s, principal, run_id or run_uuid or "", metric_key,
                               max_results)


# --- logged models (MLflow 3) --------------------------------------------------------------

@router.post(API + "/logged-models")
def create_model(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
                 s: Session = Depends(session)) -> dict[str, Any]:
    return models.create(s, principal, body)


@router.post(API + "/logged-models/search")
def search_models(body: dict[str, Any] = JsonBody, principal: Principal = Auth,
                  s: Session = Depends(session)) -> dict[str, Any]:
    return models.search(s, principal, body)


@router.get(API + "/logged-models/{model_id}")
def get_model(model_id: str, principal: Principal = Auth,
              s: Session = Depends(session)) -> dict[str, Any]:
    return models.get(s, principal, model_id)


@router.patch(API + "/logged-models/{model_id}")
def finalize_model(model_id: str, body: dict[str, Any] = JsonBody,
                   principal: Principal = Auth, s: Session = Depends(session)) -> dict[str, Any]:
    return models.update(s, principal, model_id, {"status": body.get("status")})


@router.patch(API + "/logged-models/{model_id}/tags")
def model_tags(model_id: str, body: dict[str, Any] = JsonBody, principal: Principal = Auth,
               s: Session = Depends(session)) -> dict[str, Any]:
    models.update(s, principal, model_id, {"tags": body.get("tags") or []})
    return {}


@router.delete(API + "/logged-models/{model_id}/tags/{key}")
def model_tag_delete(model_id: str, key: str, principal: Principal = Auth,
                     s: Session = Depends(session)) -> dict[str, Any]:
    return models.delete_tag(s, principal, model_id, key)


@router.post(API + "/logged-models/{model_id}/params")
def model_params(model_id: str, body: dict[str, Any] = JsonBody, principal: Principal = Auth,
                 s: Session = Depends(session)) -> dict[str, Any]:
    models.update(s, principal, model_id, {"params": body.get("params") or []})
    return {}


# --- artifacts -----------------------------------------------------------------------------

@router.get(ARTIFACTS)
def list_artifacts(path: str = Query("", max_length=4096), principal: Principal = Auth,
                   s: Session = Depends(session)) -> dict[str, Any]:
    return artifacts.listing(artifacts.resolve(s, principal, path))


def _resolve(request: Request, principal: Principal, path: str) -> artifacts.Target:
    with server_context(request).db.session() as s:
        return artifacts.resolve(s, principal, path)


@router.get(ARTIFACTS + "/{path:path}")
async def download_artifact(path: str, request: Request,
                            principal: Principal = Auth) -> Response:
    target = await run_in_threadpool(_resolve, request, principal, path)
    found = await run_in_threadpool(artifacts.open_file, target)
    return download_response(found)


@router.put(ARTIFACTS + "/{path:path}")
async def upload_artifact(path: str, request: Request, principal: Principal = Auth) -> Response:
    target = await run_in_threadpool(_resolve, request, principal, path)
    folder, tmp, name, fd = await run_in_threadpool(artifacts.start_upload, target)
    try:
        async for chunk in request.stream():
            if chunk:
                await run_in_threadpool(_write_all, fd, chunk)
    except BaseException:
        await run_in_threadpool(artifacts.abort_upload, folder, tmp, fd)
        raise
    await run_in_threadpool(artifacts.finish_upload, folder, tmp, name, fd)
    return Response(b"{}", media_type="application/json")


def _write_all(fd: int, data: bytes) -> None:
    import os

    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# --- anything else -------------------------------------------------------------------------

@router.api_route("/api/{version}/mlflow/{rest:path}",
                  methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
@router.api_route("/api/{version}/mlflow-artifacts/{rest:path}",
                  methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
@router.api_route("/ajax-api/{version}/mlflow/{rest:path}",
                  methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
async def unsupported(request: Request, principal: Principal = Auth) -> Response:
    return endpoint_not_found(request.method, request.url.path)
