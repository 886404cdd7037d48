"""Writes the audit trail's entries (services.audit) as calls are answered.

A route's rule notes what a call is about in the request's state (``state["audit"]``):
every call that changes something, every sign-in, every refused authentication and
authorisation. When the answer's status line is about to go out, this middleware writes the
note with its outcome (through the server's write batcher: entries arriving together share a
transaction, with the submits of the moment), then lets the answer go: a client that heard
the answer can read its entry. A call that raised (a 500) is written as an error. A submit
wrote its own entry with its job (``Note.written``). A failure to write is logged; it never
changes the answer."""

from __future__ import annotations

import logging
from typing import Any

from batchyard.server.services.audit import Note, write

log = logging.getLogger("batchyard.audit")


class AuditMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                note = state.get("audit")
                if isinstance(note, Note) and not note.written:
                    status = int(state.get("audit_status") or message["status"])
                    await record(scope, note, status, state.get("error"))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException:
            note = state.get("audit")
            if isinstance(note, Note) and not note.written:
                await record(scope, note, 500)
            raise


async def record(scope: Any, note: Note, status: int, detail: str | None = None) -> None:
    """Write ``note`` with the outcome ``status`` (once)."""
    note.written = True
    ctx = scope["app"].state.ctx
    row = note.row(status, detail)
    try:
        await ctx.writes.run(lambda s: write(s, [row]))
    except Exception as exc:  # the answer stands; the log says what was lost
        from batchyard.server import storage_trouble

        said = {k: row[k] for k in ("action", "actor", "target", "outcome")}
        # the database away: a line per cause, as every other write says it, not a traceback
        storage_trouble.log_once(log, f"could not write the audit entry {said}", exc)
