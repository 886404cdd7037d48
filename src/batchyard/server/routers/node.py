"""The node channel's routes (DESIGN §8). Each is called by a node launcher with its own
credential, which acts for one (attempt, node rank) only; long polls are async so that a
waiting launcher holds no thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server import notify
from batchyard.server.context import ServerContext
from batchyard.server.security.permissions import Launcher
from batchyard.server.services import channel, log_chunks

router = APIRouter(prefix="/node/attempts/{attempt}/nodes/{node_rank}", tags=["node channel"])
MAX_WAIT = 30.0
MAX_OUTPUT = 1 << 30
T = TypeVar("T")


# The rule of every node channel route: the launcher's own credential, for its own
# (attempt, node rank); it answers the server's context.
launcher = Launcher()


def _in_session(ctx: ServerContext, fn: Callable[[Session], T]) -> T:
    with channel.control_session(ctx.db) as session:
        return fn(session)


def _unlocked(ctx: ServerContext, fn: Callable[[Session], T]) -> T:
    """For calls that never touch an attempt's control (log chunks, outputs): they need not
    wait for the reconciler's pass, which holds the control lock."""
    with ctx.db.session() as session:
        return fn(session)


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=1)
    status: dict[str, Any]


class LogChunks(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: dict[str, list[Any]]
    report: Report | None = None  # a usage sample riding with the batch (node/logship.py)


class Ports(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ports: list[int]


class Relay(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = Field(min_length=1, max_length=255)
    command: str = Field(min_length=1, max_length=1 << 16)


@router.get("/plan")
def plan(attempt: str, node_rank: int, job: str | None = Query(None, max_length=64),
         nodes: str | None = Query(None, max_length=1 << 16),
         node: str | None = Query(None, max_length=255),
         ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    """``job``, ``nodes``, ``node``: the allocation a queueing backend started this node in
    (Slurm's job id, its node list, this node's name); the first such request binds the
    gang to those nodes (the start callback: no look at the queue on the way)."""
    where = {"job": job or "", "nodes": nodes or "", "node": node or ""} if job else None
    return _in_session(ctx, lambda s: channel.plan_for(ctx, s, attempt, node_rank, where))


@router.get("/snapshots/{sha}")
def snapshot(attempt: str, sha: str, ctx: ServerContext = Depends(launcher)) -> FileResponse:
    path = _in_session(ctx, lambda s: channel.snapshot_path(ctx, s, attempt, sha))
    return FileResponse(path, media_type="application/gzip")


@router.post("/status")
def status(attempt: str, node_rank: int, body: Report,
           ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    return _apply_report(ctx, attempt, node_rank, body)


@router.post("/logs")
async def logs(attempt: str, node_rank: int, body: LogChunks,
               ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    """Log chunks (appended first: a report riding with them that says the node ended comes
    after all its lines). Async: a small batch of an attempt this process knows is appended
    without a worker thread (services/log_chunks.py). ``live`` tells the launcher whether
    someone follows the logs."""
    sizes = log_chunks.append_known(attempt, body.files)
    if sizes is None:
        sizes = await run_in_threadpool(
            _unlocked, ctx, lambda s: log_chunks.append_logs(s, attempt, body.files))
    reply: dict[str, Any] = {"sizes": sizes}
    if body.report is not None:
        reply.update(await run_in_threadpool(_apply_report, ctx, attempt, node_rank,
                                             body.report))
    reply["live"] = notify.logs_live(attempt)
    return reply


def _apply_report(ctx: ServerContext, attempt: str, node_rank: int,
                  body: Report) -> dict[str, Any]:
    """A report that says something new wakes the reconciler for this attempt alone
    (server/followups.py); the launchers' long polls wake when the control changes."""
    reply = _in_session(ctx, lambda s: channel.apply_report(s, attempt, node_rank, body.seq,
                                                            body.status))
    reply["live"] = notify.logs_live(attempt)
    return reply


@router.get("/control")
async def control(attempt: str, node_rank: int, version: int = -1, wait: float = 0.0,
                  live: bool | None = None,
                  ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    """``live``: whether the launcher takes its logs to be followed; the answer comes at
    once when that is no longer so (a follower came, or the last one went)."""
    wait = max(0.0, min(wait, MAX_WAIT))
    while True:
        seen = notify.version(attempt)
        current, data = await run_in_threadpool(
            _in_session, ctx, lambda s: channel.control_of(s, attempt, node_rank))
        now_live = notify.logs_live(attempt)
        reply = {"version": current, "control": data, "live": now_live}
        if current != version or wait <= 0 or (live is not None and live != now_live):
            return reply
        if not await notify.wait_change(attempt, seen, wait):
            return reply
        wait = 0.5  # one more look after the change; then answer


@router.post("/rendezvous")
def publish(attempt: str, node_rank: int, body: Ports,
            ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    def publish_and_look(s: Session) -> dict[str, Any]:
        channel.publish_ports(s, attempt, node_rank, body.ports)
        return channel.rendezvous_of(s, attempt)  # the last node to come needs no second call

    return _in_session(ctx, publish_and_look)


@router.get("/rendezvous")
async def rendezvous(attempt: str, wait: float = 20.0,
                     ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    return await _long_poll(ctx, attempt, wait, lambda s: channel.rendezvous_of(s, attempt),
                            lambda r: bool(r.get("complete") or r.get("stop")))


@router.post("/relay")
def relay(attempt: str, body: Relay, ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    return _in_session(ctx, lambda s: channel.relay(s, attempt, body.host, body.command))


@router.get("/relay/{ident}")
async def relay_result(attempt: str, ident: str, wait: float = 20.0,
                       ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    return await _long_poll(ctx, attempt, wait,
                            lambda s: channel.relay_result(s, attempt, ident),
                            lambda r: bool(r.get("done")))


@router.put("/outputs/{path:path}")
async def put_output(attempt: str, path: str, request: Request,
                     ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    data = bytearray()
    async for chunk in request.stream():
        data.extend(chunk)
        if len(data) > MAX_OUTPUT:
            from batchyard.errors import SpecError

            raise SpecError(f"body: an output file larger than {MAX_OUTPUT >> 20} MiB")
    sha = request.headers.get("x-content-sha256")
    return await run_in_threadpool(
        _unlocked, ctx, lambda s: channel.put_output(s, attempt, path, bytes(data), sha))


async def _long_poll(ctx: ServerContext, key: str, wait: float,
                     read: Callable[[Session], dict[str, Any]],
                     ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    wait = max(0.0, min(wait, MAX_WAIT))
    import time

    deadline = time.monotonic() + wait
    while True:
        seen = notify.version(key)
        result = await run_in_threadpool(_in_session, ctx, read)
        left = deadline - time.monotonic()
        if ready(result) or left <= 0:
            return result
        await notify.wait_change(key, seen, min(left, 2.0))
