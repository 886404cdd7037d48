"""The portal's data endpoints, behind the session cookie: live job state, logs as
Server-Sent Events, metrics, experiment overlays, cluster utilisation, file downloads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse
from sqlalchemy.orm import Session

from batchyard.errors import BatchyardError
from batchyard.server.auth import Principal, server_context
from batchyard.server.context import ServerContext
from batchyard.server.portal import views
from batchyard.server.portal.access import Caller, PortalRule
from batchyard.server.routers.deps import session
from batchyard.server.routers.downloads import download_response
from batchyard.server.security.principal import Role
from batchyard.server.services import files, jobs, metrics

router = APIRouter(prefix="/portal/api", include_in_schema=False)
JOB = "/ws/{ws}/exp/{exp}/jobs/{name}"
ADMIN = Principal(admin=True)  # the metrics service's reader: the rule has decided
READ = PortalRule(Role.reader, page=False)
NO_STORE = {"Cache-Control": "no-store"}


@router.get("/ws/{ws}/clusters", dependencies=[Depends(READ)])
def clusters(ws: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return views.cluster_views(s, ws)


@router.get("/ws/{ws}/jobs")
def job_list(ws: str, experiment: str = "", state: str = "", caller: Caller = Depends(READ),
             s: Session = Depends(session)) -> list[dict[str, Any]]:
    """The jobs page's rows; ``can_manage``: whether the caller may terminate or delete."""
    return [dict(row, can_manage=caller.may_manage(ws, row))
            for row in views.job_rows(s, ws, experiment, state)]


@router.get(JOB)
def job(ws: str, exp: str, name: str, caller: Caller = Depends(READ),
        s: Session = Depends(session)) -> dict[str, Any]:
    found = views.job_view(s, ws, exp, name)
    found["can_manage"] = caller.may_manage(ws, found)
    return found


@router.get(JOB + "/files", dependencies=[Depends(READ)])
def job_files(ws: str, exp: str, name: str, attempt: int | None = None,
              s: Session = Depends(session)) -> dict[str, Any]:
    try:
        return files.list_files(s, ws, exp, name, attempt)
    except BatchyardError:
        return {"attempt": attempt, "files": []}  # not started yet: nothing to list


@router.get(JOB + "/files/content", dependencies=[Depends(READ)])
def download(ws: str, exp: str, name: str, path: str = Query(min_length=1),
             attempt: int | None = None, s: Session = Depends(session)) -> Response:
    return download_response(files.open_download(s, ws, exp, name, path, attempt), NO_STORE)


@router.get(JOB + "/metrics", dependencies=[Depends(READ)])
def job_metrics(ws: str, exp: str, name: str, after: int | None = None,
                s: Session = Depends(session)) -> list[dict[str, Any]]:
    return metrics.list_metrics(s, ADMIN, ws, exp, name, after=after, limit=20_000)


@router.get("/ws/{ws}/exp/{exp}/metric", dependencies=[Depends(READ)])
def experiment_metric(ws: str, exp: str, name: str = Query(min_length=1),
                      s: Session = Depends(session)) -> dict[str, Any]:
    return views.metric_series(s, ws, exp, name)


def sse_lines(chunk: bytes) -> bytes:
    """One event carrying a chunk of log lines: a ``data:`` field per line (the browser joins
    them with newlines). Carriage returns would end an SSE line, so they go."""
    text = chunk.decode("utf-8", "replace").replace("\r", "")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return ("".join(f"data: {line}\n" for line in lines) + "\n").encode()


def sse_end(state: str) -> bytes:
    return f"event: end\ndata: {json.dumps({'state': state})}\n\n".encode()


@router.get(JOB + "/logs", dependencies=[Depends(READ)])
def logs(request: Request, ws: str, exp: str, name: str, attempt: int | None = None,
         stream: str = "all") -> StreamingResponse:
    """Every node's and rank's log lines, ``[node/rankN] ``-prefixed, followed live until the
    job ends; then an ``end`` event. The browser reconnects by itself if the stream drops,
    so a reconnect starts over (``retry`` is long, and the page closes the stream at end)."""
    ctx: ServerContext = server_context(request)
    with ctx.db.session() as s:
        jobs.find(s, ws, exp, name)  # 404 before the stream starts

    def body() -> Iterator[bytes]:
        yield b"retry: 5000\n: start\n\n"
        try:
            for chunk in files.follow(ctx.db, ws, exp, name, node=None, rank=None,
                                      stream=stream, attempt=attempt, follow_=True,
                                      prefix=True):
                yield sse_lines(chunk)
        except BatchyardError as exc:
            message = exc.message.replace("\r", " ").replace("\n", " ")
            yield f"event: problem\ndata: {message}\n\n".encode()
        with ctx.db.session() as s:
            state = jobs.find(s, ws, exp, name).state
        yield sse_end(state)

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={**NO_STORE, "X-Accel-Buffering": "no"})
