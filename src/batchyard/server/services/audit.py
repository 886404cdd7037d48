"""The audit trail: every mutating call (with its outcome), sign-ins, failed
authentications and refused authorisations, appended to ``audit_log``.

Who records: the route's rule (security.permissions) notes what a call is about
(``Note``); ``server.auditing`` writes the note when the answer's status is known, before
the answer leaves (so a client that heard "done" can read its entry). A submit writes its
entry in the job's own transaction instead (``stage``), batched with the submits beside it
(server/batching.py): one INSERT for the batch's entries, no transaction of its own.

No entry ever holds a secret: credentials are named (``token:12``, ``home-token``,
``session``, ``job:7``), bodies are never copied, and the detail is the error's message,
which the API already shows to the caller."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import event, insert, select
from sqlalchemy.orm import Session

from batchyard.errors import SpecError
from batchyard.spec.durations import parse_duration
from batchyard.store.identity import AuditEntry
from batchyard.store.models import now

log = logging.getLogger("batchyard.audit")
_STAGED = "audit_rows"
MAX_PAGE = 10_000
_TOKENISH = re.compile(r"\b(pat|job|node|launch|join)\.[A-Za-z0-9_.-]{6,}")


@dataclass
class Note:
    """What one call is about; its outcome comes with the answer's status."""

    action: str
    actor: str = "anonymous"
    credential: str | None = None
    target: str | None = None
    workspace: str | None = None
    client: str | None = None
    detail: str | None = None
    written: bool = False
    ts: float = field(default_factory=now)

    def row(self, status: int, detail: str | None = None) -> dict[str, Any]:
        return {"ts": self.ts, "actor": self.actor[:64], "credential": self.credential,
                "action": self.action[:48], "target": self.target,
                "workspace": (self.workspace or None) and self.workspace[:64],
                "client": (self.client or None) and self.client[:64],
                "outcome": outcome_of(status), "status": status,
                "detail": scrub(detail or self.detail)}


def outcome_of(status: int) -> str:
    if status < 400:
        return "ok"
    if status == 403:
        return "denied"
    if status in (401, 429):
        return "failed"
    return "refused" if status < 500 else "error"


def scrub(text: str | None) -> str | None:
    """A message as it may be kept: short, and with anything shaped like a credential
    masked (an error never quotes one, but a user may type one into a name)."""
    if not text:
        return None
    return _TOKENISH.sub(lambda m: f"{m.group(1)}.***", text)[:500]


def stage(session: Session, row: dict[str, Any]) -> None:
    """Write ``row`` with ``session``'s transaction, at its commit (one INSERT for all rows
    staged in it)."""
    session.info.setdefault(_STAGED, []).append(row)


@event.listens_for(Session, "before_commit")
def _write_staged(session: Session) -> None:
    rows = session.info.pop(_STAGED, None)
    if rows:
        session.execute(insert(AuditEntry), rows)


@event.listens_for(Session, "after_rollback")
def _drop_staged(session: Session) -> None:
    session.info.pop(_STAGED, None)


def write(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(insert(AuditEntry), rows)


def parse_since(value: str | None) -> float | None:
    """``--since``: a duration back from now (``1d``, ``2h``, ``90m``), a date or time
    (ISO 8601, e.g. ``2025-01-31`` or ``2025-01-31T08:00``), or seconds since the epoch."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        if re.fullmatch(r"\d{9,}(\.\d+)?", text):
            return float(text)
        return time.time() - parse_duration(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise SpecError(f"since: cannot read {value!r}: use a duration back from now ('1d', "
                        "'2h', '90m'), a date ('2025-01-31', '2025-01-31T08:00') or epoch "
                        "seconds") from None
    return stamp.timestamp()


def entry_dict(row: AuditEntry) -> dict[str, Any]:
    return {"id": row.id, "ts": row.ts, "actor": row.actor, "credential": row.credential,
            "action": row.action, "target": row.target, "workspace": row.workspace,
            "client": row.client, "outcome": row.outcome, "status": row.status,
            "detail": row.detail}


def list_entries(session: Session, *, user: str | None = None, since: str | None = None,
                 workspace: str | None = None, action: str | None = None,
                 limit: int = 1000) -> list[dict[str, Any]]:
    """Entries, oldest first: the newest ``limit`` of those that match."""
    if not 1 <= limit <= MAX_PAGE:
        raise SpecError(f"limit: between 1 and {MAX_PAGE}")
    query = select(AuditEntry)
    if user:
        query = query.where(AuditEntry.actor == user)
    start = parse_since(since)
    if start is not None:
        query = query.where(AuditEntry.ts >= start)
    if workspace:
        query = query.where(AuditEntry.workspace == workspace)
    if action:
        query = query.where(AuditEntry.action.like(action.replace("*", "%")))
    rows = list(session.scalars(query.order_by(AuditEntry.id.desc()).limit(limit)))
    return [entry_dict(r) for r in reversed(rows)]


def failures_from(session: Session, client: str, since: float) -> int:
    """Failed authentications from ``client`` since then, in every server process
    (security.ratelimit)."""
    rows = session.scalars(select(AuditEntry.id).where(
        AuditEntry.client == client, AuditEntry.ts >= since,
        AuditEntry.action == "auth.failed").limit(1000))
    return len(list(rows))
