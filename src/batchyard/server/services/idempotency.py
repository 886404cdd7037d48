"""Idempotent submit: a client sends an ``Idempotency-Key`` with a submit and sends the same
key again when it cannot tell whether the first try arrived (a timeout, a dropped
connection, a 503). The first request to commit makes the job and the key's row in one
transaction; every later one with that key gets that job back and makes nothing.

The same key with a different request is a 409: the client reused a key by mistake, and
answering with the other job would hide it."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from batchyard.errors import Conflict, SpecError
from batchyard.server.services import common
from batchyard.store.db import begin_write, is_sqlite
from batchyard.store.models import IdempotencyKey, Job

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")


def check_key(key: str) -> str:
    if not _KEY.match(key):
        raise SpecError(f"{HEADER} header: use 1-200 printable ASCII characters, no spaces")
    return key


def fingerprint(request: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()


def submit_once(session: Session, workspace: str, key: str, request: dict[str, Any],
                submit: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """``submit()``'s answer, or the answer for the job this key already made (then True)."""
    check_key(key)
    printed = fingerprint(request)
    begin_write(session)  # SQLite: from here to the commit no other submit can interleave
    ws = common.workspace(session, workspace)
    found = _found(session, ws.id, key)
    if found is not None:
        return _replay(session, workspace, found, printed), True
    try:
        result = submit()
    except Conflict:  # elsewhere than SQLite a twin request may have just made the job
        if is_sqlite(session):
            raise
        session.rollback()
        found = _found(session, ws.id, key)
        if found is None:
            raise
        return _replay(session, workspace, found, printed), True
    row = IdempotencyKey(workspace_id=ws.id, key=key, fingerprint=printed,
                         job_id=result.get("id") if "jobs" not in result else None,
                         array=None if "jobs" not in result else
                         {"experiment": result.get("experiment"), "name": result.get("name")})
    if is_sqlite(session):
        session.add(row)
        session.flush()
        return result, False
    try:  # concurrent writers elsewhere: the unique constraint decides who made the job
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        session.rollback()
        found = _found(session, ws.id, key)
        if found is None:
            raise
        return _replay(session, workspace, found, printed), True
    return result, False


def _found(session: Session, workspace_id: int, key: str) -> IdempotencyKey | None:
    return session.scalar(select(IdempotencyKey).where(
        IdempotencyKey.workspace_id == workspace_id, IdempotencyKey.key == key))


def _replay(session: Session, workspace: str, row: IdempotencyKey,
            printed: str) -> dict[str, Any]:
    if row.fingerprint != printed:
        raise Conflict(f"{HEADER} {row.key!r} was already used for a different submit; "
                       "send a new key for a new job")
    if row.array:
        from batchyard.server.services import arrays

        shown = arrays.show(session, workspace, str(row.array["experiment"]),
                            str(row.array["name"]))
        if shown is not None:
            return shown
    elif row.job_id is not None:
        job = session.get(Job, row.job_id)
        if job is not None:
            from batchyard.server.services.jobs import job_dict

            return job_dict(session, job)
    raise Conflict(f"{HEADER} {row.key!r} made a job that has been deleted since")
