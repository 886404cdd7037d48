"""A job's files: rank logs and outputs of each attempt, listed, downloaded and followed.

They are the server's own copies, as the node channel delivered them (logs appended chunk by
chunk, outputs in the workspace datastore): never a node's files. Every path a client names
is resolved inside one of the attempt's known roots; nothing outside them can be read.

A job may share the server's host (the local backend) and so plant links in those copies: a
rank log name linked to ``$BATCHYARD_HOME/token``, or to ``/dev/zero``. So every file is
opened one path component at a time from the job's directory down (``open_under``): no
component may be a symbolic link, every directory must be a real one and the file a regular
file with one link; anything else is not listed and cannot be read or followed. Log lines are
cut at ``MAX_LINE`` and ``\r`` ends a line too (``split_lines``), so what a reader or a
follower holds is bounded however a job writes."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator, Sequence
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
MAX_LINE = 64 * 1024  # a longer log line goes out in pieces of this size
READ_CHUNK = 64 * 1024  # bytes read from one log file per pass of a blocking follower
_EOL = re.compile(rb"\r\n|\r|\n")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotRegular(OSError):
    """A path of a job's files that is a link, a device, a FIFO or otherwise not its own."""


# --- opening without following links ------------------------------------------------------

def open_under(attempt_dir: str | Path, parts: Sequence[str], *, directory: bool = False) -> int:
    """A descriptor of ``attempt_dir/parts...``, opened component by component from the
    job's directory (the attempt dir's parent) down, none of them followed if it is a
    symbolic link: each must be a real directory, and the last (unless ``directory``) a
    regular file with a single link (a hard link to a file elsewhere is not the job's).
    Raises OSError (``NotRegular`` for what is there but refused)."""
    att = Path(attempt_dir)
    chain = [att.parent.name, att.name, *parts]
    fd = os.open(att.parent.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(chain):
            if part in ("", ".", "..") or "/" in part or "\x00" in part:
                raise NotRegular(f"{part!r} is not a plain path component")
            last = index == len(chain) - 1 and not directory
            if last:  # look before opening: opening a device or a FIFO may do things
                before = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(before.st_mode) or before.st_nlink != 1:
                    raise NotRegular(f"{part!r} is not a regular file")
            child = os.open(part, _FILE if last else _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
            if last:
                now = os.fstat(fd)
                if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino) \
                        or not stat.S_ISREG(now.st_mode) or now.st_nlink != 1:
                    raise NotRegular(f"{part!r} changed while it was opened")
                os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def dir_under(attempt_dir: str | Path, parts: Sequence[str], *, create: bool = False) -> int:
    """A descriptor of the directory ``attempt_dir/parts...``, opened as ``open_under`` opens
    (no component a link), the missing ones made first with ``create`` (mode 0750): where
    the node channel may write what a node sent without ever writing through a link."""
    att = Path(attempt_dir)
    chain = [att.parent.name, att.name, *parts]
    fd = os.open(att.parent.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in chain:
            if part in ("", ".", "..") or "/" in part or "\x00" in part:
                raise NotRegular(f"{part!r} is not a plain path component")
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o750, dir_fd=fd)
            child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_log(path: Path, offset: int, size: int) -> bytes:
    """At most ``size`` bytes of the log file ``path`` (``<attempt dir>/stdouterr/<name>``)
    from ``offset``; nothing if it is not a regular file of the attempt (a link, a device)."""
    try:
        fd = open_under(path.parent.parent, [path.parent.name, path.name])
    except OSError:
        return b""
    try:
        return os.pread(fd, size, offset)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


# --- lines --------------------------------------------------------------------------------

def split_lines(partial: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of ``partial + chunk`` (without their ends) and what is left over.
    A line ends at ``\n``, ``\r\n`` or a lone ``\r`` (a progress bar redrawn with carriage
    returns is lines too); a line longer than ``MAX_LINE`` goes out in pieces, so what is
    left over is never more than ``MAX_LINE`` bytes (and a ``\r`` that may yet be half of a
    ``\r\n``)."""
    data = partial + chunk
    held = b""
    if data.endswith(b"\r"):
        data, held = data[:-1], b"\r"
    found = _EOL.split(data)
    rest = found.pop()
    lines = [piece for line in found for piece in pieces(line)]
    while len(rest) > MAX_LINE:
        lines.append(rest[:MAX_LINE])
        rest = rest[MAX_LINE:]
    return lines, rest + held


def last_line(partial: bytes) -> bytes | None:
    """What is left over once a file has ended, as a line (None if nothing is)."""
    if partial.endswith(b"\r"):
        partial = partial[:-1]
    return partial or None


def pieces(line: bytes) -> list[bytes]:
    if len(line) <= MAX_LINE:
        return [line]
    return [line[i:i + MAX_LINE] for i in range(0, len(line), MAX_LINE)]


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
    """The attempt's file roots by label; a root that is a link is none of them."""
    root = Path(attempt_dir)
    found: dict[str, Path] = {"stdouterr": root / "stdouterr"}
    outputs = root / "outputs"
    if _is_real_dir(root) and _is_real_dir(outputs):
        for path in sorted(outputs.iterdir()):
            if _is_real_dir(path):
                found[f"outputs/{path.name}"] = path
    return found


def _walk(attempt_dir: str, root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(path relative to ``root``, stat) of every regular file under the root, walked
    through descriptors that never follow a link (``os.fwalk`` from a root opened safely)."""
    rel_root = root.relative_to(attempt_dir).parts
    try:
        fd = open_under(attempt_dir, rel_root, directory=True)
    except OSError:
        return
    try:
        for current, _dirs, names, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            for fname in sorted(names):
                try:
                    st = os.stat(fname, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                    continue  # links, devices, FIFOs: not the job's files
                yield os.path.normpath(os.path.join(current, fname)), st
    finally:
        os.close(fd)


def list_files(session: Session, workspace: str, experiment: str, name: str,
               attempt: int | None = None) -> dict[str, Any]:
    job = find(session, workspace, experiment, name)
    att = _attempt(session, job, attempt)
    files: list[dict[str, Any]] = []
    for label, root in roots(att.directory).items():
        for rel_path, st in _walk(att.directory, root):
            files.append({"path": f"{label}/{Path(rel_path).as_posix()}", "size": st.st_size,
                          "modified": st.st_mtime})
    files.sort(key=lambda f: str(f["path"]))
    return {"attempt": att.number, "files": files}


@dataclass
class Download:
    """An open regular file of a job (the descriptor is the reader's to close), its name
    and its size when it was opened."""

    fd: int
    name: str
    size: int


def open_download(session: Session, workspace: str, experiment: str, name: str, rel: str,
                  attempt: int | None = None) -> Download:
    """Open the file ``rel`` (``stdouterr/...`` or ``outputs/<ID>/...``) of an attempt for
    reading, without following any link on the way (``open_under``)."""
    job = find(session, workspace, experiment, name)
    att = _attempt(session, job, attempt)
    if "\x00" in rel:
        raise SpecError("path: contains a NUL byte")
    for label, root in sorted(roots(att.directory).items(), key=lambda kv: -len(kv[0])):
        if rel == label or rel.startswith(label + "/"):
            inner = [p for p in rel[len(label):].split("/") if p]
            if any(p in (".", "..") for p in inner):
                raise SpecError(f"path: {rel!r} points outside the job's files")
            parts = [*root.relative_to(att.directory).parts, *inner]
            try:
                fd = open_under(att.directory, parts)
            except NotRegular:
                raise NotFound(f"file {rel!r} of attempt {att.number} is not a regular file "
                               "(links are not followed)") from None
            except OSError:
                raise NotFound(f"file {rel!r} not found in attempt {att.number}") from None
            return Download(fd, parts[-1], os.fstat(fd).st_size)
    raise NotFound(f"file {rel!r} not found: paths start with stdouterr/ or outputs/<ID>/")


def resolve(session: Session, workspace: str, experiment: str, name: str, rel: str,
            attempt: int | None = None) -> Path:
    """The path of a job's file, checked as ``open_download`` checks it. Serving the path
    opens it again (a link planted meanwhile would be followed): prefer ``open_download``."""
    found = open_download(session, workspace, experiment, name, rel, attempt)
    os.close(found.fd)
    job = find(session, workspace, experiment, name)
    att = _attempt(session, job, attempt)
    return Path(att.directory, *[p for p in rel.split("/") if p])


@dataclass
class LogSource:
    label: str
    path: Path
    offset: int = 0
    partial: bytes = b""


def _select(root: Path, node: str | None, rank: int | None, stream: str,
            node_names: list[str]) -> list[tuple[str, Path]]:
    out: list[tuple[tuple[int, int], str, Path]] = []
    if not _is_real_dir(root.parent) or not _is_real_dir(root):
        return []
    for path in sorted(root.iterdir()):
        m = LOG_RE.match(path.name)
        if not m or path.is_symlink():
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
                if follow_ and state not in TERMINAL:
                    notify.follow_logs(att.uuid)  # its launchers ship each line at once
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
        more = True
        while more:  # bounded reads, as many as it takes: the client's pace sets ours
            more = False
            for src in sources.values():
                chunk = _read_new(src)
                if not chunk:
                    continue
                more = more or len(chunk) == READ_CHUNK
                lines, src.partial = split_lines(src.partial, chunk)
                if lines:
                    yield b"".join(_fmt(src.label, ln, show_prefix) for ln in lines)
        if not follow_ or (done and waited_for_start):
            for src in sources.values():
                line = last_line(src.partial)
                src.partial = b""
                if line is not None:
                    yield _fmt(src.label, line, show_prefix)
            return
        if done:
            waited_for_start = True  # one more pass to drain what was written at the end
            continue
        notify.wait_logs(0.25)  # woken as soon as a node's chunk lands


def _read_new(src: LogSource) -> bytes:
    data = read_log(src.path, src.offset, READ_CHUNK)
    src.offset += len(data)
    return data


def _fmt(label: str, line: bytes, prefix: bool) -> bytes:
    if prefix:
        return f"[{label}] ".encode() + line + b"\n"
    return line + b"\n"
