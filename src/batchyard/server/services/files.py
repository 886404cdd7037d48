"""A job's files: rank logs and outputs of each attempt, listed, downloaded and followed.

They are the server's own copies, as the node channel delivered them (logs appended chunk by
chunk, outputs in the workspace datastore): never a node's files. Every path a client names
is resolved inside one of the attempt's known roots; nothing outside them can be read."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import NotFound, SpecError
from batchyard.server import notify
from batchyard.server.services.jobs import find
from batchyard.states import JOB_TERMINAL
from batchyard.store.db import Database
from batchyard.store.models import Attempt, Job

LOG_RE = re.compile(
    r"^(?P<node>.+)-(?P<what>rank(?P<rank>\d+)|prepare|mpirun|mount)\.(?P<stream>stdout|stderr)\.txt$"
)
TERMINAL = JOB_TERMINAL


def _attempt(session: Session, job: Job, number: int | None) -> Attempt:
    query = select(Attempt).where(Attempt.job_id == job.id)
    if number is not None:
        query = query.where(Attempt.number == number)
    attempt = session.scalar(query.order_by(Attempt.number.desc()).limit(1))
    if attempt is None:
        if number is None:
            raise NotFound(f"job {job.name!r} has not started yet: no files")
        raise NotFound(f"job {job.name!r} has no attempt {number}")
    return attempt


def roots(attempt_dir: str) -> dict[str, Path]:
    root = Path(attempt_dir)
    found: dict[str, Path] = {"stdouterr": root / "stdouterr"}
    outputs = root / "outputs"
    if outputs.is_dir():
        for path in sorted(outputs.iterdir()):
            if path.is_dir():
                found[f"outputs/{path.name}"] = path
    return found


def list_files(session: Session, workspace: str, experiment: str, name: str,
               attempt: int | None = None) -> dict[str, Any]:
    job = find(session, workspace, experiment, name)
    att = _attempt(session, job, attempt)
    files: list[dict[str, Any]] = []
    for label, root in roots(att.directory).items():
        if not root.is_dir():
            continue
        for current, _dirs, names in os.walk(root):
            for fname in sorted(names):
                path = Path(current) / fname
                try:
                    st = path.stat()
                except OSError:
                    continue
                rel = f"{label}/{path.relative_to(root).as_posix()}"
                files.append({"path": rel, "size": st.st_size, "modified": st.st_mtime})
    files.sort(key=lambda f: str(f["path"]))
    return {"attempt": att.number, "files": files}


def resolve(session: Session, workspace: str, experiment: str, name: str, rel: str,
            attempt: int | None = None) -> Path:
    job = find(session, workspace, experiment, name)
    att = _attempt(session, job, attempt)
    for label, root in sorted(roots(att.directory).items(), key=lambda kv: -len(kv[0])):
        if rel == label or rel.startswith(label + "/"):
            inner = rel[len(label):].lstrip("/")
            target = (root / inner).resolve()
            base = root.resolve()
            if target != base and base not in target.parents:
                raise SpecError(f"path: {rel!r} points outside the job's files")
            if not target.is_file():
                raise NotFound(f"file {rel!r} not found in attempt {att.number}")
            return target
    raise NotFound(f"file {rel!r} not found: paths start with stdouterr/ or outputs/<ID>/")


@dataclass
class LogSource:
    label: str
    path: Path
    offset: int = 0
    partial: bytes = b""


def _select(root: Path, node: str | None, rank: int | None, stream: str,
            node_names: list[str]) -> list[tuple[str, Path]]:
    out: list[tuple[tuple[int, int], str, Path]] = []
    if not root.is_dir():
        return []
    for path in sorted(root.iterdir()):
        m = LOG_RE.match(path.name)
        if not m:
            continue
        if stream != "all" and m["stream"] != stream:
            continue
        if rank is not None and (m["rank"] is None or int(m["rank"]) != rank):
            continue
        if node is not None and m["node"] != node and not (
            node.isdigit() and int(node) < len(node_names) and node_names[int(node)] == m["node"]
        ):
            continue
        suffix = "" if m["stream"] == "stdout" else ":err"
        order = (0, -1) if m["rank"] is None else (1, int(m["rank"]))
        out.append((order, f"{m['node']}/{m['what']}{suffix}", path))
    out.sort()
    return [(label, path) for _order, label, path in out]


def follow(db: Database, workspace: str, experiment: str, name: str, *, node: str | None,
           rank: int | None, stream: str, attempt: int | None, follow_: bool,
           prefix: bool | None) -> Iterator[bytes]:
    """Yield log lines as they are written; with follow, until the job has ended and every
    file has been read to its end."""
    if stream not in ("stdout", "stderr", "all"):
        raise SpecError("stream: use stdout, stderr or all")
    sources: dict[Path, LogSource] = {}
    waited_for_start = False
    while True:
        with db.session() as session:
            job = find(session, workspace, experiment, name)
            state = job.state
            try:
                att = _attempt(session, job, attempt)
                att_dir: str | None = att.directory
                node_names = list((att.handle or {}).get("node_names") or [])
            except NotFound:
                if not follow_ or state in TERMINAL:
                    raise
                att_dir, node_names = None, []
        if att_dir:
            root = roots(att_dir)["stdouterr"]
            for label, path in _select(root, node, rank, stream, node_names):
                if path not in sources:
                    sources[path] = LogSource(label, path)
        show_prefix = prefix if prefix is not None else len(sources) > 1 or rank is None
        done = state in TERMINAL
        for src in sources.values():
            chunk = _read_new(src)
            if not chunk:
                continue
            data = src.partial + chunk
            lines = data.split(b"\n")
            src.partial = lines.pop()
            if lines:
                yield b"".join(_fmt(src.label, ln, show_prefix) for ln in lines)
        if not follow_ or (done and waited_for_start):
            for src in sources.values():
                if src.partial:
                    yield _fmt(src.label, src.partial, show_prefix)
                    src.partial = b""
            return
        if done:
            waited_for_start = True  # one more pass to drain what was written at the end
            continue
        notify.wait_logs(0.25)  # woken as soon as a node's chunk lands


def _read_new(src: LogSource) -> bytes:
    try:
        with open(src.path, "rb") as fh:
            fh.seek(src.offset)
            data = fh.read(4 * 1024 * 1024)
    except OSError:
        return b""
    src.offset += len(data)
    return data


def _fmt(label: str, line: bytes, prefix: bool) -> bytes:
    if prefix:
        return f"[{label}] ".encode() + line + b"\n"
    return line + b"\n"
