"""TensorBoard from the portal's job page: ``/portal/tensorboard/ws/W/exp/E/jobs/J/`` runs the
real TensorBoard (started on first use, one per job and server process, stopped after
IDLE_STOP without a request) on the server's copy of the job's outputs, and passes the
browser's requests to it behind the portal's sign-in. TensorBoard listens on loopback only
and dies with the server (PR_SET_PDEATHSIG, kept across its exec)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from batchyard import tensorboard_proc
from batchyard.errors import NotFound, ServerUnavailable
from batchyard.server.auth import server_context
from batchyard.server.portal.access import PortalRule
from batchyard.server.security.principal import Role
from batchyard.server.services import jobs
from batchyard.store.models import Attempt

PREFIX = "/portal/tensorboard"
JOB = "/ws/{ws}/exp/{exp}/jobs/{name}"
IDLE_STOP = 600.0
START_TIMEOUT = 90.0
MAX_LOOK = 5000  # directory entries looked at when checking a job's outputs for event files
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
       "host", "cookie", "authorization"}
router = APIRouter(prefix=PREFIX, include_in_schema=False,
                   dependencies=[Depends(PortalRule(Role.reader, page=True))])


def available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def has_event_files(outputs: Path) -> bool:
    looked = 0
    for _current, _dirs, names in os.walk(outputs):
        looked += len(names) + len(_dirs)
        if any("tfevents" in n for n in names):
            return True
        if looked > MAX_LOOK:
            return False
    return False


def link_for(attempt_dir: str | None, ws: str, exp: str, name: str) -> str | None:
    """The job page's link, when TensorBoard can show something of this attempt."""
    if not attempt_dir or not available() or not has_event_files(Path(attempt_dir) /
                                                                  "outputs"):
        return None
    return f"{PREFIX}/ws/{ws}/exp/{exp}/jobs/{name}/"


@dataclass
class Board:
    proc: subprocess.Popen[bytes]
    port: int
    logdir: str
    used: float = field(default_factory=time.monotonic)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


_boards: dict[str, Board] = {}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(board: Board) -> None:
    if board.proc.poll() is None:
        board.proc.terminate()
        try:
            board.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            board.proc.kill()
            board.proc.wait()


def _reap(now: float) -> None:
    for key, board in list(_boards.items()):
        if board.proc.poll() is not None or now - board.used > IDLE_STOP:
            _stop(board)
            _boards.pop(key, None)


async def _board(prefix: str, logdir: str) -> Board:
    _reap(time.monotonic())
    board = _boards.get(prefix)
    if board is not None and board.logdir != logdir:  # a new attempt
        _stop(board)
        board = None
    if board is None:
        port = _free_port()
        # started from the event loop's thread: it lives as long as the server (the
        # parent-death signal follows the thread that started the child)
        proc = subprocess.Popen(
            tensorboard_proc.argv(["--logdir", logdir, "--path_prefix", prefix, "--host",
                                   "127.0.0.1", "--port", str(port), "--reload_interval",
                                   "10"]),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        board = _boards[prefix] = Board(proc, port, logdir)
        asyncio.get_running_loop().create_task(_wait_ready(board, prefix))
    board.used = time.monotonic()
    try:
        await asyncio.wait_for(board.ready.wait(), START_TIMEOUT)
    except asyncio.TimeoutError:
        raise ServerUnavailable("TensorBoard did not start in time") from None
    if board.proc.poll() is not None:
        _boards.pop(prefix, None)
        raise ServerUnavailable(f"TensorBoard exited with code {board.proc.returncode}")
    return board


async def _wait_ready(board: Board, prefix: str) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT
    async with httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline and board.proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                answer = await http.get(f"http://127.0.0.1:{board.port}{prefix}/data/logdir")
                if answer.status_code == 200:
                    break
            await asyncio.sleep(0.3)
    board.ready.set()


def _logdir(request: Request, ws: str, exp: str, name: str) -> str:
    ctx = server_context(request)
    with ctx.db.session() as s:
        job = jobs.find(s, ws, exp, name)
        attempt = s.scalar(select(Attempt).where(Attempt.job_id == job.id)
                           .order_by(Attempt.number.desc()).limit(1))
        directory = attempt.directory if attempt is not None else None
    if directory is None or not has_event_files(Path(directory) / "outputs"):
        raise NotFound(f"job {name!r} has no TensorBoard event files")
    return str(Path(directory) / "outputs")


@router.get(JOB)
def bare(ws: str, exp: str, name: str) -> Response:
    return RedirectResponse(f"{PREFIX}/ws/{ws}/exp/{exp}/jobs/{name}/", status_code=307)


@router.api_route(JOB + "/{rest:path}", methods=["GET", "POST"])
async def proxy(request: Request, ws: str, exp: str, name: str, rest: str) -> Response:
    import httpx

    if not available():
        raise NotFound("TensorBoard is not installed on the server "
                       "(pip install 'batchyard[tensorboard]')")
    logdir = await run_in_threadpool(_logdir, request, ws, exp, name)
    prefix = f"{PREFIX}/ws/{ws}/exp/{exp}/jobs/{name}"
    board = await _board(prefix, logdir)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    async with httpx.AsyncClient(timeout=60.0) as http:
        answer = await http.request(request.method,
                                    f"http://127.0.0.1:{board.port}{prefix}/{rest}",
                                    params=request.query_params, headers=headers,
                                    content=await request.body())
    kept: dict[str, Any] = {k: v for k, v in answer.headers.items() if k.lower() not in HOP}
    return Response(answer.content, status_code=answer.status_code, headers=kept)
