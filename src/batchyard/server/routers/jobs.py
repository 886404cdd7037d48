from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.orm import Session

from batchyard.errors import NotFound
from batchyard.server.auth import context
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
from batchyard.server.security.permissions import InWorkspace
from batchyard.server.security.principal import Principal, Role
from batchyard.server.services import (
    arrays,
    audit,
    estimates,
    files,
    idempotency,
    jobs,
    whatif,
)
from batchyard.server.services import logs as job_logs
from batchyard.server.services.log_frames import MAX_CURSOR
from batchyard.server.telemetry import instruments
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import JobSpec
from batchyard.store.models import Job

router = APIRouter(tags=["jobs"], route_class=CommitRoute)
READ = InWorkspace(Role.reader)
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
async def submit(ws: str, body: SubmitIn, response: Response, request: Request,
                 who: Principal = Depends(InWorkspace(Role.contributor, "job.submit")),
                 ctx: ServerContext = Depends(context),
                 idempotency_key: str | None = Header(
                     None, alias=idempotency.HEADER, max_length=200,
                     description="A key the client makes once per job and sends again with "
                     "every retry of the same submit: the job is made once, and retries get "
                     f"it back (with {idempotency.REPLAYED}: true).")) -> dict[str, Any]:
    """Written with the submits that arrive at the same moment, in one transaction
    (server/batching.py); each answer is the one it would have got alone. Its audit entry
    is written in that transaction too (services.audit.stage)."""
    began = time.perf_counter()
    try:
        return await _submit(ws, body, response, ctx, idempotency_key, request.state.audit,
                             who)
    finally:
        instruments.observe_submit(time.perf_counter() - began)


async def _submit(ws: str, body: SubmitIn, response: Response, ctx: ServerContext,
                  idempotency_key: str | None, note: audit.Note,
                  who: Principal) -> dict[str, Any]:
    try:  # here: a bad spec never costs the submits batched with it a second try
        spec = JobSpec.model_validate(body.spec)
    except ValidationError as exc:
        raise spec_error_from(exc, "job spec", model=JobSpec) from None

    def write(s: Session) -> tuple[dict[str, Any], bool]:
        def make() -> dict[str, Any]:
            return jobs.submit(ctx, s, ws, spec, experiment=body.experiment,
                               cluster=body.cluster, name=body.name,
                               source_format=body.source_format, dry_run=body.dry_run,
                               created_by=who.name)

        if idempotency_key is None or body.dry_run:
            made = make(), False
        else:
            made = idempotency.submit_once(s, ws, idempotency_key, body.model_dump(), make)
        if not body.dry_run:  # a dry run changes nothing: no entry
            note.target = f"{made[0].get('experiment')}/{made[0].get('name')}"
            audit.stage(s, note.row(201))
        return made

    slow = body.dry_run or bool(spec.code and not spec.code.startswith("snapshot:"))
    if slow:  # a dry run reads nodes and renders; a code directory is packed on the server
        result, replayed = await ctx.writes.run_alone(write)
    else:
        result, replayed = await ctx.writes.run(write)
    note.written = True
    if replayed:
        response.headers[idempotency.REPLAYED] = "true"
    return result


@router.get("/workspaces/{ws}/jobs", response_model=list[dict[str, Any]])
def list_all(ws: str, experiment: str | None = None,
             state: str | None = None, cluster: str | None = None,
             created_by: str | None = Query(None, max_length=64,
                                            description="Only the jobs this user submitted."),
             mine: bool = Query(False, description="Only the jobs the caller submitted."),
             who: Principal = Depends(READ),
             limit: int | None = Query(None, ge=1, le=jobs.MAX_PAGE,
                                       description="One page of at most this many jobs, "
                                       "newest first; the next page's cursor comes in the "
                                       "X-Next-Cursor header (absent on the last page)."),
             cursor: str | None = Query(None, max_length=200,
                                        description="X-Next-Cursor of the page before."),
             s: Session = Depends(session)) -> Response:
    """Jobs of the workspace. Without ``limit`` and ``cursor``: every job, oldest first (the
    answer clients without paging expect). With either: one page, newest first. The rows
    are encoded once, as FastAPI would encode them (`plain_json`)."""
    by = who.name if mine else created_by
    if limit is None and cursor is None:
        return plain_json(jobs.list_all(s, ws, experiment, state, cluster, created_by=by))
    rows, following = jobs.list_page(s, ws, experiment, state, cluster, created_by=by,
                                     limit=limit or jobs.DEFAULT_PAGE, cursor=cursor)
    return plain_json(rows, {NEXT_CURSOR: following} if following else None)


def plain_json(rows: list[dict[str, Any]], headers: dict[str, str] | None = None) -> Response:
    """``rows`` as the JSON FastAPI makes of a ``list[dict[str, Any]]`` answer (pydantic's
    JSON mode, compact), without its validating copy of every row first: a third of a
    10,000-job listing's server time went there (issue 37: `job list --all -o json`)."""
    import pydantic_core

    return Response(pydantic_core.to_json(rows), media_type="application/json",
                    headers=headers)


@router.get(JOB, dependencies=[Depends(READ)])
def show(ws: str, exp: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    """A job; or, when ``name`` is a job array's, the array (its jobs and their states).
    A queued job's answer has its ``estimated_start`` (services.estimates)."""
    try:
        found = jobs.show(s, ws, exp, name)
    except NotFound:
        array = arrays.show(s, ws, exp, name)
        if array is None:
            raise
        return array
    if found.get("state") == "queued":
        row = s.get(Job, found["id"])
        if row is not None:
            found.update(estimates.of_job_safely(s, row.id, row.cluster_id))
    return found


@router.post("/workspaces/{ws}/jobs/what-if")
def what_if(ws: str, body: SubmitIn,
            who: Principal = Depends(InWorkspace(Role.contributor)),
            s: Session = Depends(session)) -> dict[str, Any]:
    """`job create --what-if`: checked as a submit is, answered with when it would start
    and what would start it sooner (fewer nodes, another cluster); nothing is stored."""
    try:
        spec = JobSpec.model_validate(body.spec)
    except ValidationError as exc:
        raise spec_error_from(exc, "job spec", model=JobSpec) from None
    return whatif.answer(s, ws, spec, cluster=body.cluster, created_by=who.name)


@router.post(JOB + "/terminate", dependencies=[
    Depends(InWorkspace(Role.contributor, "job.terminate", own=True))])
def terminate(ws: str, exp: str, name: str, s: Session = Depends(session),
              ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    try:
        return jobs.terminate(ctx, s, ws, exp, name)
    except NotFound:
        found = arrays.terminate(ctx, s, ws, exp, name)  # every job of the array
        if found is None:
            raise
        return found


@router.delete(JOB, status_code=204, dependencies=[
    Depends(InWorkspace(Role.contributor, "job.delete", own=True))])
def delete(ws: str, exp: str, name: str, s: Session = Depends(session)) -> Response:
    jobs.delete(s, ws, exp, name)
    return Response(status_code=204)


@router.get(JOB + "/files", dependencies=[Depends(READ)])
def list_files(ws: str, exp: str, name: str, attempt: AttemptQuery = None,
               s: Session = Depends(session)) -> dict[str, Any]:
    return files.list_files(s, ws, exp, name, attempt)


@router.get(JOB + "/files/content", dependencies=[Depends(READ)])
def download(ws: str, exp: str, name: str, path: str = Query(min_length=1, max_length=4096),
             attempt: AttemptQuery = None, s: Session = Depends(session)) -> Response:
    """The file as an attachment that a browser never runs (routers.downloads)."""
    return download_response(files.open_download(s, ws, exp, name, path, attempt))


@router.get(JOB + "/logs", dependencies=[Depends(READ)])
async def logs(ws: str, exp: str, name: str, node: str | None = Query(None, max_length=255),
               rank: int | None = Query(None, ge=0, le=INT32_MAX),
               stream: str = "all", attempt: AttemptQuery = None, follow: bool = False,
               prefix: bool | None = None,
               format: Literal["text", "jsonl"] = "text",
               cursor: str | None = Query(None, max_length=MAX_CURSOR),
               ctx: ServerContext = Depends(context)) -> StreamingResponse:
    """The job's log lines; with ``follow``, live until the job has ended. Async on purpose:
    a follower waits on the server's log signals, holding no worker thread (services.logs).
    ``format=jsonl``: resumable JSON lines, each with a ``cursor`` to send back (``cursor=``)
    after a broken stream, ending with an ``end`` line (services/log_frames.py)."""
    first, rest = await job_logs.open_follow(ctx.db, ws, exp, name, node=node, rank=rank,
                                             stream=stream, attempt=attempt, follow=follow,
                                             prefix=prefix, cursor=cursor,
                                             framed=format == "jsonl")

    async def body() -> AsyncIterator[bytes]:
        if first:
            yield first
        async for chunk in rest:
            yield chunk

    return StreamingResponse(body(), media_type="application/x-ndjson" if format == "jsonl"
                             else "text/plain; charset=utf-8")
