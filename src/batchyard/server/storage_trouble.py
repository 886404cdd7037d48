"""The server's own storage failing (a full disk, a database made read-only, the database
server gone) is not a bug of the request: it is a 503 naming the cause, with Retry-After, and
the server stays up to answer again once space or the database returns. Nothing half-written
is kept: the request's transaction is rolled back as for any error."""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Any

RETRY_AFTER = "10"
_OS_CAUSES = {errno.ENOSPC: "the server's disk is full", errno.EDQUOT: "the server's disk "
              "quota is used up", errno.EROFS: "the server's file system is read-only"}
_DB_TEXT = (("database or disk is full", "the server's disk is full (the database cannot "
             "grow)"),
            ("no space left on device", "the server's disk is full"),
            ("could not extend file", "the database server's disk is full"),
            ("readonly database", "the database is read-only"),
            ("read-only transaction", "the database is read-only"),
            ("disk i/o error", "the database's disk failed to read or write"),
            ("unable to open database file", "the database file cannot be opened"),
            ("connection refused", "the database server does not answer"),
            ("server closed the connection", "the database server closed the connection"),
            ("terminating connection", "the database server is shutting down"),
            # PostgreSQL going down or coming up (a restart, a failover): FATAL at connect
            ("the database system is shutting down", "the database server is shutting down"),
            ("the database system is starting up", "the database server is starting up"),
            ("the database system is in recovery mode", "the database server is recovering"),
            ("the database system is not yet accepting connections",
             "the database server is starting up"),
            ("the database system is not accepting connections",
             "the database server is not accepting connections"),
            ("consistent recovery state has not been yet reached",
             "the database server is starting up"),
            ("connection timeout expired", "the database server does not answer"),
            ("could not receive data from server", "the database server closed the connection"),
            ("could not send data to server", "the database server closed the connection"),
            ("ssl connection has been closed unexpectedly",
             "the database server closed the connection"),
            ("connection is lost", "the database server closed the connection"),
            ("the connection is closed", "the database server closed the connection"))


def cause_of(exc: BaseException) -> str | None:
    """Plain words for a storage failure anywhere in ``exc``'s chain; None for anything
    else (a real bug stays a 500)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _OS_CAUSES:
            return _OS_CAUSES[current.errno]
        if _is_db_error(current):
            text = str(current).lower()
            for needle, words in _DB_TEXT:
                if needle in text:
                    return words
        current = current.__cause__ or current.__context__
    return None


def _is_db_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith(("sqlalchemy", "sqlite3", "psycopg"))


def answer(cause: str) -> dict[str, Any]:
    return {"error": {"code": "storage_unavailable",
                      "message": f"{cause}; nothing was changed, try again later"}}


QUIET_FOR = 60.0  # s: one line per cause and logger in this time, however many requests meet it
_said: dict[tuple[str, str], tuple[float, int]] = {}
_said_lock = threading.Lock()


def log_once(log: logging.Logger, what: str, exc: BaseException, *,
             traceback: bool = True) -> None:
    """Log ``what`` failing because of ``exc``: one line (no traceback) for a storage cause,
    once per cause every QUIET_FOR seconds with the count of the ones left unsaid; anything
    else with its traceback, as a bug deserves (unless ``traceback`` is false: a connection
    of its own that breaks, the cause then being the error's type). A 10 s database outage
    logged 131 full tracebacks, one per request and pass."""
    cause = cause_of(exc)
    if cause is None and traceback:
        log.error("%s", what, exc_info=exc)
        return
    cause = cause or type(exc).__name__
    key = (log.name + ":" + what, cause)
    now = time.monotonic()
    with _said_lock:
        last, hidden = _said.get(key, (float("-inf"), 0))
        if now - last < QUIET_FOR:
            _said[key] = (last, hidden + 1)
            return
        _said[key] = (now, 0)
    more = f" ({hidden} more like it in the last {QUIET_FOR:.0f} s)" if hidden else ""
    log.warning("%s: %s (%s: %s)%s", what, cause, type(exc).__name__,
                str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "", more)


def recovered(log: logging.Logger, what: str) -> None:
    """Say once that ``what`` works again after storage trouble was logged for it."""
    prefix = log.name + ":" + what
    with _said_lock:
        gone = [k for k in _said if k[0] == prefix]
        for key in gone:
            del _said[key]
    if gone:
        log.info("%s works again", what)
