"""``job exec`` and ``cluster node exec -it`` over a WebSocket, and the node channel's two
session routes (services/exec_sessions.py says how they meet).

The client's socket: binary frames are stdin (to the client: one stream byte, 1 stdout or
2 stderr, then the bytes, as kubectl's channels); text frames are JSON: ``{"resize": [rows,
cols]}`` and ``{"eof": true}`` from the client, ``{"exit_code": N, "error": ...}`` last from
the server. Everything is checked before the handshake is accepted: a refusal is a plain HTTP
4xx with the usual error body, naming what was wrong."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.websockets import WebSocketDisconnect

from batchyard.errors import BatchyardError, SpecError
from batchyard.server import auditing, notify, workers
from batchyard.server.context import ServerContext
from batchyard.server.routers.agent import agent_node_id
from batchyard.server.routers.node import launcher
from batchyard.server.security.permissions import Admin, InWorkspace, Rule, requires
from batchyard.server.security.principal import Role
from batchyard.server.services import exec_sessions
from batchyard.server.services.audit import Note
from batchyard.server.services.exec_sessions import ExecSession

router = APIRouter(tags=["exec"])
EXEC_JOB = InWorkspace(Role.contributor, "job.exec", own=True, jobs=True, audit_jobs=True)
EXEC_NODE = Admin("cluster.node.exec")
NODE = "/node/attempts/{attempt}/nodes/{node_rank}/sessions/{ident}"
MAX_WAIT = 30.0
CHECK_EVERY = 2.0


class OutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=1)
    o: str | None = Field(None, max_length=1 << 22)
    e: str | None = Field(None, max_length=1 << 22)
    started: bool | None = None
    pid: int | None = None
    exit_code: int | None = None
    error: str | None = Field(None, max_length=4096)


@router.post(NODE + "/out", response_model=None)
async def session_out(attempt: str, node_rank: int, ident: str, body: OutIn, request: Request,
                      ctx: ServerContext = Depends(launcher)) -> dict[str, Any] | Response:
    if (forwarded := await workers.forward_if_elsewhere(
            request, ident, body.model_dump(exclude_none=True))) is not None:
        return forwarded
    return await _output(exec_sessions.for_node(ident, attempt, node_rank), body)


async def _output(sess: ExecSession, body: OutIn) -> dict[str, Any]:
    """Output for the client; held up while the client has a backlog (a slow terminal)."""
    deadline = time.monotonic() + MAX_WAIT / 2
    while sess.backlog()[1] > exec_sessions.MAX_BACKLOG and not sess.closed \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    if sess.closed:
        raise exec_sessions.Gone("the session has ended: its client has gone")
    sess.node_out(body.seq, body.model_dump(exclude_none=True))
    return {"seq": sess.out_seq}


@router.get(NODE + "/in", response_model=None)
async def session_in(attempt: str, node_rank: int, ident: str, request: Request, after: int = 0,
                     wait: float = 0.0, ctx: ServerContext = Depends(launcher)
                     ) -> dict[str, Any] | Response:
    if (forwarded := await workers.forward_if_elsewhere(request, ident)) is not None:
        return forwarded
    return await _inputs(exec_sessions.for_node(ident, attempt, node_rank), after, wait)


async def _inputs(sess: ExecSession, after: int, wait: float) -> dict[str, Any]:
    """What the client sent after ``after``: a long poll, answered at once when there is."""
    deadline = time.monotonic() + max(0.0, min(wait, MAX_WAIT))
    while True:
        seen = notify.version(sess.key_in)
        items, closed = sess.inputs_after(max(0, after))
        left = deadline - time.monotonic()
        if items or closed or left <= 0:
            return {"items": items, "closed": closed}
        await notify.wait_change(sess.key_in, seen, left)


@router.post("/agent/nodes/{node}/sessions/{ident}/out", response_model=None)
async def agent_session_out(ident: str, body: OutIn, request: Request,
                            node_id: int = Depends(agent_node_id)) -> dict[str, Any] | Response:
    """``cluster node exec -it`` on a machine: its agent relays as a launcher does."""
    if (forwarded := await workers.forward_if_elsewhere(
            request, ident, body.model_dump(exclude_none=True))) is not None:
        return forwarded
    return await _output(exec_sessions.for_agent(ident, node_id), body)


@router.get("/agent/nodes/{node}/sessions/{ident}/in", response_model=None)
async def agent_session_in(ident: str, request: Request, after: int = 0, wait: float = 0.0,
                           node_id: int = Depends(agent_node_id)) -> dict[str, Any] | Response:
    if (forwarded := await workers.forward_if_elsewhere(request, ident)) is not None:
        return forwarded
    return await _inputs(exec_sessions.for_agent(ident, node_id), after, wait)


# --- the client's socket ------------------------------------------------------------------

def _args(websocket: WebSocket) -> dict[str, Any]:
    query = websocket.query_params
    tty = query.get("tty", "0") in ("1", "true")
    return {"argv": query.getlist("argv"), "tty": tty,
            "size": exec_sessions.decode_size(query.get("rows", 24), query.get("cols", 80)),
            "term": (query.get("term") or "xterm")[:64], "user": query.get("user")}


async def _refuse(websocket: WebSocket, exc: BatchyardError) -> None:
    await _audit(websocket, exc.http_status, exc.message)
    headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
    await websocket.send_denial_response(JSONResponse(
        {"error": exc.to_dict()}, status_code=exc.http_status, headers=headers))


async def _audit(websocket: WebSocket, status: int, detail: str | None = None) -> None:
    """What the rule noted (an exec, a refusal, a failed sign-in), with its outcome: no
    middleware sees a WebSocket's answer."""
    note = websocket.scope.get("state", {}).get("audit")
    if isinstance(note, Note) and not note.written:
        await auditing.record(websocket.scope, note, status, detail)


async def _allowed(rule: Rule, websocket: WebSocket) -> Any:
    websocket.scope.setdefault("state", {})
    return await rule.check(websocket)


@router.websocket("/workspaces/{ws}/experiments/{exp}/jobs/{name}/exec")
@requires(EXEC_JOB)
async def job_exec(websocket: WebSocket, ws: str, exp: str, name: str) -> None:
    ctx: ServerContext = websocket.app.state.ctx
    try:
        principal = await _allowed(EXEC_JOB, websocket)
        raw = websocket.query_params.get("node", "0")
        if not raw.isdigit():
            raise SpecError(f"--node {raw!r}: a node rank (0, 1, ...)")
        sess = await run_in_threadpool(exec_sessions.open_job, ctx, principal, ws, exp, name,
                                       int(raw), **_args(websocket))
    except BatchyardError as exc:
        await _refuse(websocket, exc)
        return
    await _audit(websocket, 101)
    await _serve(ctx, websocket, sess)


@router.websocket("/workspaces/{ws}/clusters/{name}/nodes/{node}/exec")
@requires(EXEC_NODE)
async def node_exec(websocket: WebSocket, ws: str, name: str, node: str) -> None:
    ctx: ServerContext = websocket.app.state.ctx
    try:
        principal = await _allowed(EXEC_NODE, websocket)
        sess = await run_in_threadpool(exec_sessions.open_node, ctx, principal, ws, name, node,
                                       **_args(websocket))
    except BatchyardError as exc:
        await _refuse(websocket, exc)
        return
    await _audit(websocket, 101)
    await _serve(ctx, websocket, sess)


async def _serve(ctx: ServerContext, websocket: WebSocket, sess: ExecSession) -> None:
    await websocket.accept()
    reader = asyncio.create_task(_read_client(websocket, sess))
    try:
        await _write_client(ctx, websocket, sess, reader)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass  # the client went away mid-write
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        await run_in_threadpool(exec_sessions.end, ctx, sess)


async def _read_client(websocket: WebSocket, sess: ExecSession) -> None:
    import base64

    try:
        while True:
            while sess.backlog()[0] > exec_sessions.MAX_BACKLOG and not sess.closed:
                await asyncio.sleep(0.02)  # the node is slow to take stdin: so is the client
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("bytes"):
                data = message["bytes"]
                for at in range(0, len(data), exec_sessions.MAX_INPUT):
                    sess.push({"data": base64.b64encode(data[at:at + exec_sessions.MAX_INPUT])
                               .decode()})
            elif message.get("text"):
                with contextlib.suppress(ValueError, TypeError, KeyError, IndexError):
                    control = json.loads(message["text"])
                    if control.get("resize"):
                        sess.push({"resize": list(exec_sessions.decode_size(
                            *control["resize"][:2]))})
                    elif control.get("eof"):
                        sess.push({"eof": True})
    except (WebSocketDisconnect, RuntimeError, BatchyardError):
        pass
    sess.close()


async def _write_client(ctx: ServerContext, websocket: WebSocket, sess: ExecSession,
                        reader: asyncio.Task[None]) -> None:
    checked = time.monotonic()
    while True:
        seen = notify.version(sess.key_out)
        for stream, data in sess.take_output():
            await websocket.send_bytes((b"\x01" if stream == "o" else b"\x02") + data)
        if sess.done:
            await websocket.send_text(json.dumps({"exit_code": sess.exit_code,
                                                  "error": sess.error}))
            with contextlib.suppress(RuntimeError, OSError):
                await websocket.close()
            return
        if reader.done():  # the client left: the node is told on its next input poll
            return
        if time.monotonic() - checked > CHECK_EVERY:
            checked = time.monotonic()
            why = await run_in_threadpool(exec_sessions.still_served, ctx, sess)
            if why:
                sess.fail(why)
                continue
        await notify.wait_change(sess.key_out, seen, CHECK_EVERY)

