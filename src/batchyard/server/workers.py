"""Several server processes behind one port (``batchyard server start --workers N``, on
PostgreSQL). One process holds the GIL for everything it serves: on this project's 2-core
machine a single server topped out at ~400 submits/s with a core to spare, the database
idle. Each worker is a whole server (API, and a reconciler that acts only while its process
holds the lease, ``server.leader``); they share the database, the home's files, and the
wake-ups of ``server.bus``.

The first process supervises: it binds N sockets to one port with SO_REUSEPORT (the kernel
spreads connections over them, and ``server.balance`` evens out where keep-alive ones
landed), starts workers 1..N-1 on the others, starts a dead one again, and stops them when it
stops. A worker dies with its supervisor (``PR_SET_PDEATHSIG``), so a ``kill -9`` of the
server leaves no API process behind.

What lives in one process's memory is an exec session (``services/exec_sessions``): its
client's WebSocket and its node's calls may reach different workers. A session's id names its
worker, and a node's call that lands elsewhere is forwarded to that worker over a private
socket (an abstract Unix socket per worker, not a file, so nothing lingers)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response

from batchyard.errors import NotFound, SpecError

log = logging.getLogger(__name__)

ENV = "BATCHYARD_WORKER_OF"
MAX_WORKERS = 64
RESTART_BACKOFF = (0.5, 30.0)  # seconds before starting a dead worker again: first, most
STEADY = 60.0  # a worker that ran this long before dying starts again at the first backoff
STOP_GRACE = 10.0
FORWARDED = "x-batchyard-forwarded"
FORWARD_TIMEOUT = 60.0

_index: int | None = None  # this process's worker number (None: the server is one process)
_group = ""  # the supervisor's pid: names the private sockets of its workers


def parse_count(value: str | int | None) -> int:
    """``--workers`` / ``BATCHYARD_WORKERS``: a count, "auto" (the machine's cores)."""
    if value is None or value == "":
        return 1
    if str(value).strip().lower() == "auto":
        return max(1, min(MAX_WORKERS, os.cpu_count() or 1))
    try:
        count = int(value)
    except ValueError:
        raise SpecError(f"--workers: expected a number of processes or 'auto', got {value!r}")\
            from None
    if not 1 <= count <= MAX_WORKERS:
        raise SpecError(f"--workers: between 1 and {MAX_WORKERS}, got {count}")
    return count


def check_database(count: int, dialect: str) -> None:
    if count > 1 and dialect != "postgresql":
        raise SpecError("--workers: more than one server process needs PostgreSQL "
                        "(BATCHYARD_DB_URL); SQLite has a single writer, so one process "
                        "serves it")


def become(index: int, group: str) -> None:
    global _index, _group
    _index, _group = index, group


def index() -> int | None:
    return _index


def session_tag() -> str:
    """The prefix of an exec session id made here: it names this worker."""
    return f"w{_index}." if _index is not None else ""


def owner_elsewhere(ident: str, request: Request) -> int | None:
    """The worker that holds exec session ``ident``, when that is not this process."""
    if _index is None or request.headers.get(FORWARDED) or not ident.startswith("w"):
        return None
    number, dot, _ = ident[1:].partition(".")
    if not dot or not number.isdigit() or int(number) == _index:
        return None
    return int(number)


def private_address(index: int, group: str | None = None) -> str:
    return f"\0batchyard-{group or _group}-w{index}"


_clients: dict[tuple[int, int], httpx.AsyncClient] = {}


async def forward_if_elsewhere(request: Request, ident: str,
                               body: dict[str, Any] | None = None) -> Response | None:
    """The owner's answer to a node's call on exec session ``ident`` when another worker
    holds it; None when it is this process's to answer."""
    owner = owner_elsewhere(ident, request)
    return None if owner is None else await forward(request, owner, body)


async def forward(request: Request, owner: int, body: dict[str, Any] | None = None) -> Response:
    """Hand a node's call on an exec session to the worker that holds it; its answer, as is.
    The call keeps its own credential: the owner checks it again."""
    loop_key = (id(asyncio.get_running_loop()), owner)
    client = _clients.get(loop_key)
    if client is None:
        client = _clients[loop_key] = httpx.AsyncClient(
            base_url="http://worker", timeout=FORWARD_TIMEOUT,
            transport=httpx.AsyncHTTPTransport(uds=private_address(owner)))
    headers = {FORWARDED: "1", "authorization": request.headers.get("authorization", "")}
    try:
        answer = await client.request(request.method, request.url.path,
                                      params=request.query_params, json=body, headers=headers)
    except httpx.TransportError:
        raise NotFound("exec session not found: the server process that held it has "
                       "stopped") from None
    return Response(answer.content, status_code=answer.status_code,
                    media_type=answer.headers.get("content-type"))


def serve_privately(app: Any, index: int) -> None:
    """The private socket of this worker, for forwarded calls: plain HTTP on an abstract
    Unix socket (it never leaves the machine), served from a thread of its own."""
    import uvicorn

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(private_address(index))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           lifespan="off", proxy_headers=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="private-api",
                     daemon=True).start()


def die_with(parent: int) -> None:
    """Be killed when the supervisor dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


class Pool:
    """The supervisor's workers 1..N-1, one per extra socket."""

    def __init__(self, sockets: list[socket.socket], spec: dict[str, Any]) -> None:
        self.sockets = sockets
        self.spec = spec
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._started: dict[int, float] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="workers", daemon=True)

    def start(self) -> None:
        for number in range(1, len(self.sockets) + 1):
            self.procs[number] = self._spawn(number)
        self._thread.start()

    def _spawn(self, number: int) -> subprocess.Popen[bytes]:
        fd = self.sockets[number - 1].fileno()
        self._started[number] = time.monotonic()
        env = {**os.environ, ENV: json.dumps({**self.spec, "index": number, "fd": fd,
                                               "supervisor": os.getpid()})}
        # a process group of their own: a terminal's Ctrl-C reaches the supervisor, which
        # stops them, instead of racing it
        return subprocess.Popen([sys.executable, "-m", "batchyard.server"], env=env,
                                pass_fds=[fd, self.spec["balance_fd"]],
                                stdin=subprocess.DEVNULL, process_group=0)

    def _watch(self) -> None:
        delay = RESTART_BACKOFF[0]
        while not self._stopping.wait(0.5):
            for number, proc in list(self.procs.items()):
                if proc.poll() is None or self._stopping.is_set():
                    continue
                if time.monotonic() - self._started.get(number, 0.0) >= STEADY:
                    delay = RESTART_BACKOFF[0]
                log.warning("server worker %d (pid %d) exited with %s; starting it again in "
                            "%.1fs", number, proc.pid, proc.returncode, delay)
                if self._stopping.wait(delay):
                    return
                self.procs[number] = self._spawn(number)
                delay = min(RESTART_BACKOFF[1], delay * 2)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]

    def stop(self) -> None:
        self._stopping.set()
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
