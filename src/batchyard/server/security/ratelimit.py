"""Failed sign-ins are rate-limited per client address: after ``LIMIT`` failed
authentications (a token presented and refused: unknown, expired, revoked, a disabled
user's) within ``WINDOW`` seconds, every call from that address is answered 429 until the
window has passed, its token not even looked at (a valid one would otherwise tell itself
apart from the guesses).

The count holds across server processes: each failure is in the audit trail, and a process
that sees a failure from an address counts that address's failures there (in every process
of the database) before it lets the next one through. Blocking itself is decided in memory,
so a blocked address costs no database work. A call without any token is not a failure (no
credential was tried) and is not counted. Behind a proxy every client has the proxy's
address: the limit is then the proxy's."""

from __future__ import annotations

import os
import threading
import time

LIMIT = int(os.environ.get("BATCHYARD_AUTH_FAILURES", "30"))
WINDOW = float(os.environ.get("BATCHYARD_AUTH_WINDOW", "60"))
MAX_ADDRESSES = 100_000

_lock = threading.Lock()
_failures: dict[str, list[float]] = {}
_blocked: dict[str, float] = {}  # address -> until (time.time())


def retry_after(client: str | None) -> float | None:
    """Seconds until ``client`` may try again, None when it is not blocked."""
    if not client:
        return None
    until = _blocked.get(client)
    if until is None:
        return None
    left = until - time.time()
    if left <= 0:
        with _lock:
            _blocked.pop(client, None)
        return None
    return left


def failed(client: str | None, elsewhere: int = 0) -> bool:
    """Count one failure from ``client`` (``elsewhere``: the failures the database knows of
    in the window, this process's included); True when it is now blocked."""
    if not client:
        return False
    stamp = time.time()
    with _lock:
        if len(_failures) > MAX_ADDRESSES:
            _failures.clear()
        recent = [t for t in _failures.get(client, []) if t > stamp - WINDOW]
        recent.append(stamp)
        _failures[client] = recent
        if max(len(recent), elsewhere + 1) >= LIMIT:
            _blocked[client] = stamp + WINDOW
            _failures.pop(client, None)
            return True
    return False


def recent_here(client: str) -> int:
    stamp = time.time()
    return len([t for t in _failures.get(client, []) if t > stamp - WINDOW])


def reset() -> None:
    with _lock:
        _failures.clear()
        _blocked.clear()
