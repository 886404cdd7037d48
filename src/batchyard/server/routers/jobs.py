from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy.orm import Session

from batchyard.server.auth import context, require_admin
from batchyard.server.context import ServerContext
from batchyard.server.routers.deps import session
from batchyard.server.services import files, jobs
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import JobSpec

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_admin)])
JOB = "/workspaces/{ws}/experiments/{exp}/jobs/{name}"


class SubmitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any]
    experiment: str | None = None
    cluster: str | None = None
    name: str | None = None
    source_format: str = "native"
    dry_run: bool = False


@router.post("/workspaces/{ws}/jobs", status_code=201)
def submit(ws: str, body: SubmitIn, s: Session = Depends(session),
           ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    try:
        spec = JobSpec.model_validate(body.spec)
    except ValidationError as exc:
        raise spec_error_from(exc, "job spec") from None
    return jobs.submit(ctx, s, ws, spec, experiment=body.experiment, cluster=body.cluster,
                       name=body.name, source_format=body.source_format, dry_run=body.dry_run)


@router.get("/workspaces/{ws}/jobs")
def list_all(ws: str, experiment: str | None = None, state: str | None = None,
             cluster: str | None = None, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return jobs.list_all(s, ws, experiment, state, cluster)


@router.get(JOB)
def show(ws: str, exp: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    return jobs.show(s, ws, exp, name)


@router.post(JOB + "/terminate")
def terminate(ws: str, exp: str, name: str, s: Session = Depends(session),
              ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    return jobs.terminate(ctx, s, ws, exp, name)


@router.delete(JOB, status_code=204)
def delete(ws: str, exp: str, name: str, s: Session = Depends(session)) -> Response:
    jobs.delete(s, ws, exp, name)
    return Response(status_code=204)


@router.get(JOB + "/files")
def list_files(ws: str, exp: str, name: str, attempt: int | None = None,
               s: Session = Depends(session)) -> dict[str, Any]:
    return files.list_files(s, ws, exp, name, attempt)


@router.get(JOB + "/files/content")
def download(ws: str, exp: str, name: str, path: str = Query(min_length=1),
             attempt: int | None = None, s: Session = Depends(session)) -> FileResponse:
    target = files.resolve(s, ws, exp, name, path, attempt)
    return FileResponse(target, filename=target.name)


@router.get(JOB + "/logs")
def logs(ws: str, exp: str, name: str, node: str | None = None, rank: int | None = None,
         stream: str = "all", attempt: int | None = None, follow: bool = False,
         prefix: bool | None = None, ctx: ServerContext = Depends(context)) -> StreamingResponse:
    with ctx.db.session() as s:
        jobs.find(s, ws, exp, name)  # 404 before the stream starts
    gen = files.follow(ctx.db, ws, exp, name, node=node, rank=rank, stream=stream,
                       attempt=attempt, follow_=follow, prefix=prefix)
    first = next(gen, b"")  # surface argument errors as a 4xx, not a broken stream

    def body() -> Any:
        if first:
            yield first
        yield from gen

    return StreamingResponse(body(), media_type="text/plain; charset=utf-8")
