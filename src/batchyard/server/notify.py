"""Wake-ups for the node channel's long polls. Every change a launcher must hear of (cancel,
abort, finish, a relay exec, a rendezvous, an exec's exit) bumps a counter per attempt; a long
poll sleeps until its attempt's counter moves, then re-reads the database. The counters are
only a hint (a restarted server starts at zero): the database is the truth."""

from __future__ import annotations

import asyncio
import threading
import time

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


def logs_arrived() -> None:
    """Wake every `job logs -f` follower: some attempt's server copy just grew."""
    with _logs:
        _logs.notify_all()


def wait_logs(timeout: float) -> None:
    with _logs:
        _logs.wait(timeout)
