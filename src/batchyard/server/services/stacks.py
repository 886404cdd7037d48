"""Stack dumps of a running attempt (`job stacks`, the hang watchdog): a request goes to
every node launcher in the attempt's control (each takes it once, by id); each node's answer
comes back over the node channel and is kept with the attempt, on the server's disk
(``<attempt dir>/stacks/<id>/request.json`` and ``node-<N>.json``), so dumps outlive the
attempt and a server restart. Files are written through directory descriptors that never
follow a link (a job on the local backend shares the server's disk)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import Conflict, NotFound, SpecError
from batchyard.server import followups, notify
from batchyard.server.services import channel, files
from batchyard.store.models import Attempt, Job, Node

KEEP_REQUESTS = 4  # requests kept in the control (a launcher started late takes these)
MAX_DUMP = 8 << 20  # bytes of one node's dump
ID_RE = re.compile(r"^[0-9a-z][0-9a-z-]{0,47}$")
REQUEST = "request.json"


def key(attempt_uuid: str, ident: str) -> str:
    """The notify key a waiting `job stacks` sleeps on."""
    return f"stacks:{attempt_uuid}:{ident}"


def node_names(session: Session, attempt: Attempt) -> list[str]:
    names = list((attempt.handle or {}).get("node_names") or [])
    if len(names) < len(attempt.node_ids):
        nodes = [session.get(Node, i) for i in attempt.node_ids]
        names = [n.name if n is not None else f"node {r}" for r, n in enumerate(nodes)]
    return names


# --- files --------------------------------------------------------------------------------

def _write(attempt: Attempt, ident: str, name: str, data: dict[str, Any]) -> None:
    Path(attempt.directory).parent.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder = files.dir_under(attempt.directory, ["stacks", ident], create=True)
    except OSError as exc:
        raise Conflict(f"the attempt's stacks directory is not a plain directory: {exc}") \
            from None
    tmp = f".{name}.{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o640, dir_fd=folder)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)


def _read(attempt: Attempt, parts: list[str]) -> dict[str, Any] | None:
    try:
        fd = files.open_under(attempt.directory, parts)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        try:
            data = json.loads(fh.read(MAX_DUMP + 1))
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def _idents(attempt: Attempt) -> list[str]:
    try:
        fd = files.open_under(attempt.directory, ["stacks"], directory=True)
    except OSError:
        return []
    try:
        return sorted(n for n in os.listdir(fd) if ID_RE.match(n))
    finally:
        os.close(fd)


# --- requests -----------------------------------------------------------------------------

def request(session: Session, attempt: Attempt, reason: str) -> dict[str, Any]:
    """Ask every node of the attempt for a dump (the caller holds channel.CONTROL_LOCK)."""
    ident = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    meta = {"id": ident, "reason": reason, "attempt": attempt.number,
            "attempt_uuid": attempt.uuid, "requested_at": time.time(),
            "nodes": node_names(session, attempt)}
    _write(attempt, ident, REQUEST, meta)
    control = dict(attempt.control or {})
    wanted = [*list(control.get("stacks") or [])[-(KEEP_REQUESTS - 1):],
              {"id": ident, "reason": reason}]
    control["stacks"] = wanted
    channel.set_control(attempt, control)
    return meta


def running_attempt(session: Session, job: Job) -> Attempt:
    attempt = session.scalar(select(Attempt).where(Attempt.job_id == job.id)
                             .order_by(Attempt.number.desc()).limit(1))
    if attempt is None or attempt.state not in ("running", "stopping") or \
            job.state != "running":
        state = job.state if attempt is None else f"{job.state}, attempt {attempt.number} " \
            f"{attempt.state}"
        raise Conflict(f"job {job.name!r} has no running ranks to dump ({state}); dumps "
                       "taken before: `batchyard job stacks --list`")
    return attempt


def store(session: Session, attempt_uuid: str, node_rank: int, ident: str,
          dump: dict[str, Any]) -> dict[str, Any]:
    """One node's answer; a resend replaces it (a dump is a snapshot, not a log)."""
    attempt = session.scalar(select(Attempt).where(Attempt.uuid == attempt_uuid))
    if attempt is None:
        raise NotFound(f"attempt {attempt_uuid} not found")
    if not ID_RE.match(ident) or _read(attempt, ["stacks", ident, REQUEST]) is None:
        raise NotFound(f"stack dump {ident!r} was never asked of this attempt")
    if len(json.dumps(dump)) > MAX_DUMP:
        raise SpecError(f"dump: larger than {MAX_DUMP >> 20} MiB")
    dump = {**dump, "node_rank": node_rank, "received_at": time.time()}
    _write(attempt, ident, f"node-{node_rank}.json", dump)
    notify.bump(key(attempt_uuid, ident))
    followups.attempt(None, attempt.id)  # the hang watchdog may be waiting for it (written)
    return {"id": ident, "node_rank": node_rank}


def collect(attempt: Attempt, ident: str) -> dict[str, Any]:
    """The request and every answer so far; ``missing``: the nodes that have not answered."""
    meta = _read(attempt, ["stacks", ident, REQUEST]) if ID_RE.match(ident) else None
    if meta is None:
        raise NotFound(f"no stack dump {ident!r} in attempt {attempt.number}")
    names = list(meta.get("nodes") or [])
    dumps, missing = [], []
    for rank, name in enumerate(names):
        dump = _read(attempt, ["stacks", ident, f"node-{rank}.json"])
        if dump is None:
            missing.append(name)
        else:
            dumps.append(dump)
    return {**meta, "dumps": dumps, "missing": missing, "complete": not missing}


def find_dump(session: Session, job: Job, ident: str) -> Attempt:
    for attempt in session.scalars(select(Attempt).where(Attempt.job_id == job.id)
                                   .order_by(Attempt.number.desc())):
        if ident in _idents(attempt):
            return attempt
    raise NotFound(f"job {job.name!r} has no stack dump {ident!r}")


def listing(session: Session, job: Job) -> list[dict[str, Any]]:
    """Every dump kept with the job's attempts, oldest first (by requested_at: an id's time
    is to the second, then random, so two dumps of one second would list in either order)."""
    out = []
    for attempt in session.scalars(select(Attempt).where(Attempt.job_id == job.id)
                                   .order_by(Attempt.number)):
        rows: list[dict[str, Any]] = []
        for ident in _idents(attempt):
            with contextlib.suppress(NotFound):
                found = collect(attempt, ident)
                rows.append({k: found[k] for k in ("id", "reason", "attempt", "requested_at",
                                                   "nodes", "missing", "complete")})
        rows.sort(key=lambda r: r["requested_at"] if isinstance(r["requested_at"], (int, float))
                  else 0.0)
        out.extend(rows)
    return out
