"""The server's own storage failing (a full disk, a database made read-only, the database
server gone) is not a bug of the request: it is a 503 naming the cause, with Retry-After, and
the server stays up to answer again once space or the database returns. Nothing half-written
is kept: the request's transaction is rolled back as for any error."""

from __future__ import annotations

import errno
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
            ("terminating connection", "the database server is shutting down"))


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
