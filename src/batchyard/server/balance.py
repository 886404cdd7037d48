"""Keeping a ``--workers`` server's keep-alive connections even across its processes.

The kernel hands each new connection to one process's socket by a hash of its addresses
(SO_REUSEPORT), and a keep-alive connection stays where it landed. 16 clients hashed 10 to
one process and 6 to the other: the first process's clients waited 52 ms a submit, the
second's 32 ms, and the whole server's p99 was the busy process's.

Every process publishes how many connections it holds (a 32-bit count per process in one
anonymous shared file, ``memfd``, that the supervisor makes and every worker inherits). A
process holding two or more above the least loaded one answers its next request with
``Connection: close``, after the request has run: the client opens a new connection for the
next one, and the kernel hashes that one afresh. One connection moves at a time, at most one
per SHED_GAP; nothing in flight is cut, and a client sees only a reconnect."""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from typing import Any

PUBLISH_EVERY = 0.1  # seconds between a process's count updates
SHED_GAP = 0.25  # at least this long between two closes by one process (its count updates)
MARGIN = 2  # close one when holding this many more than the least loaded process
_SLOT = struct.Struct("<I")


def make_shared(processes: int) -> int:
    """The supervisor's shared file: one count per process, all zero (a worker gets it
    through ``pass_fds``)."""
    fd = os.memfd_create("batchyard-connections")
    os.ftruncate(fd, _SLOT.size * processes)
    return fd


class Balance:
    """One process's side: publish its count, and tell when it holds more than its share."""

    def __init__(self, fd: int, index: int, processes: int) -> None:
        self.fd, self.index = fd, index
        self._counts = struct.Struct(f"<{processes}I")
        self._last_shed = 0.0

    def publish(self, connections: int) -> None:
        os.pwrite(self.fd, _SLOT.pack(min(connections, 0xFFFFFFFF)), _SLOT.size * self.index)

    def counts(self) -> tuple[int, ...]:
        return self._counts.unpack(os.pread(self.fd, self._counts.size, 0))

    def over_share(self) -> bool:
        now = time.monotonic()
        if now - self._last_shed < SHED_GAP:
            return False
        counts = self.counts()
        if counts[self.index] < min(counts) + MARGIN:
            return False
        self._last_shed = now
        return True

    def publish_from(self, server: Any, stop: threading.Event) -> threading.Thread:
        """Publish ``server``'s (a uvicorn.Server) open connections every PUBLISH_EVERY."""

        def loop() -> None:
            while not stop.wait(PUBLISH_EVERY):
                with contextlib.suppress(OSError):
                    self.publish(len(server.server_state.connections))

        thread = threading.Thread(target=loop, name="connections", daemon=True)
        thread.start()
        return thread


class ShedConnections:
    """ASGI: adds ``Connection: close`` to an HTTP answer of a process over its share (the
    public socket's app only; a worker's private socket serves the plain app)."""

    def __init__(self, app: Any, balance: Balance) -> None:
        self.app = app
        self.balance = balance

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.balance.over_share():
            await self.app(scope, receive, send)
            return

        async def closing(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)
