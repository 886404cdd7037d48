"""Wake-ups for the node channel's long polls. Every change a launcher must hear of (cancel,
abort, finish, a relay exec, a rendezvous, an exec's exit) bumps a counter per attempt; a long
poll sleeps until its attempt's counter moves, then re-reads the database. The counters are
only a hint (a restarted server starts at zero): the database is the truth.

Log arrivals are one signal for all attempts (``logs_arrived``): threads wait on a condition,
event loops subscribe a callback (``on_logs``; services.logs hangs its followers off it)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

_lock = threading.Lock()
_versions: dict[str, int] = {}
POLL = 0.005


def bump(key: str) -> None:
    with _lock:
        _versions[key] = _versions.get(key, 0) + 1


def version(key: str) -> int:
    with _lock:
        return _versions.get(key, 0)


async def wait_change(key: str, seen: int, timeout: float) -> bool:
    """Sleep until ``key`` moved past ``seen`` or ``timeout`` passed; True if it moved."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if version(key) != seen:
            return True
        await asyncio.sleep(POLL)
    return version(key) != seen


_logs = threading.Condition()
_log_listeners: dict[int, tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = {}
_listeners_lock = threading.Lock()
_next_listener = 0


def logs_arrived() -> None:
    """Wake every `job logs -f` follower: some attempt's server copy just grew. Threads
    waiting in ``wait_logs`` wake at once; each event loop with a listener (``on_logs``)
    gets its callback scheduled on that loop (one per loop: the followers there hang off it,
    no thread each)."""
    with _logs:
        _logs.notify_all()
    with _listeners_lock:
        listeners = list(_log_listeners.items())
    for key, (loop, callback) in listeners:
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # that loop has closed
            with _listeners_lock:
                _log_listeners.pop(key, None)


def wait_logs(timeout: float) -> None:
    with _logs:
        _logs.wait(timeout)


def on_logs(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` on ``loop`` whenever logs arrive; returns the unsubscribe."""
    global _next_listener
    with _listeners_lock:
        _next_listener += 1
        key = _next_listener
        _log_listeners[key] = (loop, callback)

    def unsubscribe() -> None:
        with _listeners_lock:
            _log_listeners.pop(key, None)

    return unsubscribe
