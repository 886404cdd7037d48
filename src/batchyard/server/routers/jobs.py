from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.orm import Session

from batchyard.errors import NotFound
from batchyard.server.auth import context, require_admin
from batchyard.server.context import ServerContext
from batchyard.server.routers.deps import (
    INT32_MAX,
    ClusterName,
    CommitRoute,
    ExperimentName,
    JobName,
    session,
)
from batchyard.server.routers.downloads import download_response
from batchyard.server.services import arrays, files, idempotency, jobs
from batchyard.server.services import logs as job_logs
from batchyard.server.telemetry import instruments
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import JobSpec

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_admin)],
                   route_class=CommitRoute)
JOB = "/workspaces/{ws}/experiments/{exp}/jobs/{name}"
NEXT_CURSOR = "X-Next-Cursor"
AttemptQuery = Annotated[int | None, Query(ge=1, le=INT32_MAX,
                                           description="An attempt number (default: the last)")]


class SubmitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any]
    experiment: ExperimentName = None
    cluster: ClusterName = None
    name: JobName = None
    source_format: str = Field("native", min_length=1, max_length=16,
                               pattern=r"^[A-Za-z0-9_.-]+$")
    dry_run: bool = False


@router.post("/workspaces/{ws}/jobs", status_code=201)
async def submit(ws: str, body: SubmitIn, response: Response,
                 ctx: ServerContext = Depends(context),
                 idempotency_key: str | None = Header(
                     None, alias=idempotency.HEADER, max_length=200,
                     description="A key the client makes once per job and sends again with "
                     "every retry of the same submit: the job is made once, and retries get "
                     f"it back (with {idempotency.REPLAYED}: true).")) -> dict[str, Any]:
    """Written with the submits that arrive at the same moment, in one transaction
    (server/batching.py); each answer is the one it would have got alone."""
    began = time.perf_counter()
    try:
        return await _submit(ws, body, response, ctx, idempotency_key)
    finally:
        instruments.observe_submit(time.perf_counter() - began)


async def _submit(ws: str, body: SubmitIn, response: Response, ctx: ServerContext,
                  idempotency_key: str | None) -> dict[str, Any]:
    try:  # here: a bad spec never costs the submits batched with it a second try
        spec = JobSpec.model_validate(body.spec)
    except ValidationError as exc:
        raise spec_error_from(exc, "job spec") from None

    def write(s: Session) -> tuple[dict[str, Any], bool]:
        def make() -> dict[str, Any]:
            return jobs.submit(ctx, s, ws, spec, experiment=body.experiment,
                               cluster=body.cluster, name=body.name,
                               source_format=body.source_format, dry_run=body.dry_run)

        if idempotency_key is None or body.dry_run:
            return make(), False
        return idempotency.submit_once(s, ws, idempotency_key, body.model_dump(), make)

    slow = body.dry_run or bool(spec.code and not spec.code.startswith("snapshot:"))
    if slow:  # a dry run reads nodes and renders; a code directory is packed on the server
        result, replayed = await ctx.writes.run_alone(write)
    else:
        result, replayed = await ctx.writes.run(write)
    if replayed:
        response.headers[idempotency.REPLAYED] = "true"
    return result


@router.get("/workspaces/{ws}/jobs")
def list_all(ws: str, response: Response, experiment: str | None = None,
             state: str | None = None, cluster: str | None = None,
             limit: int | None = Query(None, ge=1, le=jobs.MAX_PAGE,
                                       description="One page of at most this many jobs, "
                                       "newest first; the next page's cursor comes in the "
                                       "X-Next-Cursor header (absent on the last page)."),
             cursor: str | None = Query(None, max_length=200,
                                        description="X-Next-Cursor of the page before."),
             s: Session = Depends(session)) -> list[dict[str, Any]]:
    """Jobs of the workspace. Without ``limit`` and ``cursor``: every job, oldest first (the
    answer clients without paging expect). With either: one page, newest first."""
    if limit is None and cursor is None:
        return jobs.list_all(s, ws, experiment, state, cluster)
    rows, following = jobs.list_page(s, ws, experiment, state, cluster,
                                     limit=limit or jobs.DEFAULT_PAGE, cursor=cursor)
    if following:
        response.headers[NEXT_CURSOR] = following
    return rows


@router.get(JOB)
def show(ws: str, exp: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    """A job; or, when ``name`` is a job array's, the array (its jobs and their states)."""
    try:
        return jobs.show(s, ws, exp, name)
    except NotFound:
        found = arrays.show(s, ws, exp, name)
        if found is None:
            raise
        return found


@router.post(JOB + "/terminate")
def terminate(ws: str, exp: str, name: str, s: Session = Depends(session),
              ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    try:
        return jobs.terminate(ctx, s, ws, exp, name)
    except NotFound:
        found = arrays.terminate(ctx, s, ws, exp, name)  # every job of the array
        if found is None:
            raise
        return found


@router.delete(JOB, status_code=204)
def delete(ws: str, exp: str, name: str, s: Session = Depends(session)) -> Response:
    jobs.delete(s, ws, exp, name)
    return Response(status_code=204)


@router.get(JOB + "/files")
def list_files(ws: str, exp: str, name: str, attempt: AttemptQuery = None,
               s: Session = Depends(session)) -> dict[str, Any]:
    return files.list_files(s, ws, exp, name, attempt)


@router.get(JOB + "/files/content")
def download(ws: str, exp: str, name: str, path: str = Query(min_length=1, max_length=4096),
             attempt: AttemptQuery = None, s: Session = Depends(session)) -> Response:
    """The file as an attachment that a browser never runs (routers.downloads)."""
    return download_response(files.open_download(s, ws, exp, name, path, attempt))


@router.get(JOB + "/logs")
async def logs(ws: str, exp: str, name: str, node: str | None = Query(None, max_length=255),
               rank: int | None = Query(None, ge=0, le=INT32_MAX),
               stream: str = "all", attempt: AttemptQuery = None, follow: bool = False,
               prefix: bool | None = None,
               ctx: ServerContext = Depends(context)) -> StreamingResponse:
    """The job's log lines; with ``follow``, live until the job has ended. Async on purpose:
    a follower waits on the server's log signals, holding no worker thread (services.logs)."""
    first, rest = await job_logs.open_follow(ctx.db, ws, exp, name, node=node, rank=rank,
                                             stream=stream, attempt=attempt, follow=follow,
                                             prefix=prefix)

    async def body() -> AsyncIterator[bytes]:
        if first:
            yield first
        async for chunk in rest:
            yield chunk

    return StreamingResponse(body(), media_type="text/plain; charset=utf-8")
