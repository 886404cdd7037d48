"""Wake-ups between the server processes of one PostgreSQL database: the workers of one
server (``--workers``) and standbys on other machines. Without it a launcher's long poll
served by one process slept through a cancel written by another until its timeout, and the
reconciler saw another process's submit only at its next tick.

PostgreSQL's LISTEN/NOTIFY carries them: one connection listens, one publishes. Messages are
hints, as ``notify`` says: the database stays the truth, and a process that missed some (its
connection dropped) wakes everything once it listens again. A burst of the same message is
sent once (a stream of submits is one ``kick`` per round trip, not one per submit)."""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from batchyard.server import storage_trouble

log = logging.getLogger(__name__)

CHANNEL = "batchyard_wake"
MAX_PAYLOAD = 7000  # PostgreSQL refuses a payload of 8000 bytes or more
RETRY = 1.0
# after a gap in listening: everything may have moved
WAKE_ALL = ("kick", "logs", "bump *", "follow *")


class Bus:
    def __init__(self, engine: Engine, deliver: Callable[[str], None]) -> None:
        self._conninfo = engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False)
        self._deliver = deliver
        self.origin = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._pending: dict[str, None] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.listening = threading.Event()

    def start(self) -> None:
        for target, name in ((self._listen, "bus-listen"), (self._publish, "bus-publish")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=3)

    def publish(self, message: str) -> None:
        with self._cond:
            if message not in self._pending:
                self._pending[message] = None
                self._cond.notify()

    # --- the two connections ---------------------------------------------------------------

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10,
                               application_name="batchyard-bus")

    def _publish(self) -> None:
        conn = None
        while not self._stop.is_set():
            with self._cond:
                while not self._pending and not self._stop.is_set():
                    self._cond.wait()
                messages, self._pending = list(self._pending), {}
            if self._stop.is_set():
                break
            try:
                conn = conn if conn is not None and not conn.closed else self._connect()
                for payload in _payloads(self.origin, messages):
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
            except Exception as exc:
                storage_trouble.log_once(
                    log, "publishing wake-ups to the other server processes failed; "
                    "retrying", exc, traceback=False)
                _close(conn)
                conn = None
                with self._cond:  # not lost: sent with the next batch
                    self._pending = {**dict.fromkeys(messages), **self._pending}
                self._stop.wait(RETRY)
        _close(conn)

    def _listen(self) -> None:
        first = True
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._connect()
                conn.execute(f"LISTEN {CHANNEL}")
                self.listening.set()
                if not first:
                    for message in WAKE_ALL:
                        self._deliver(message)
                first = False
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=1.0):
                        self._take(note.payload)
            except Exception as exc:
                if self._stop.is_set():
                    break
                storage_trouble.log_once(
                    log, "listening for the other server processes' wake-ups failed; "
                    "reconnecting", exc, traceback=False)  # a line per cause, not a second
                self.listening.clear()
                self._stop.wait(RETRY)
            finally:
                _close(conn)

    def _take(self, payload: str) -> None:
        origin, _, body = payload.partition("\n")
        if origin == self.origin:
            return
        for message in body.split("\n"):
            if message:
                try:
                    self._deliver(message)
                except Exception:
                    log.exception("a wake-up from another server process failed: %r",
                                  message)


def _payloads(origin: str, messages: list[str]) -> list[str]:
    """Messages joined by newlines under the payload limit, each prefixed by the sender."""
    out: list[str] = []
    current = origin
    for message in messages:
        message = message.replace("\n", " ")[:MAX_PAYLOAD - len(origin) - 2]
        if len(current) + 1 + len(message) > MAX_PAYLOAD:
            out.append(current)
            current = origin
        current += "\n" + message
    if current != origin:
        out.append(current)
    return out


def _close(conn: Any) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception:
            log.debug("closing a bus connection failed", exc_info=True)
