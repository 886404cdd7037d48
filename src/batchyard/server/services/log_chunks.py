"""Log chunks from node launchers into the server's copy of an attempt's logs, exactly once:
a chunk is appended only at the offset the copy ends at; any other offset (a resend, a gap)
changes nothing and the reply says where the copy ends. Every write goes through a
descriptor of the real directory, never a link a job planted there.

Each arrival wakes the followers of that attempt at once (``notify.logs_arrived``). A batch
from a launcher whose attempt this process already wrote for, small and not waiting on a
lock, is appended on the event loop itself (``append_known``): no database read and no
worker thread between the launcher's write and its followers. Anything else (the first batch
of an attempt, a big one, a busy lock, a log directory that is gone) takes the full path in a
worker thread (``append_logs``), which finds the attempt in the database."""

from __future__ import annotations

import base64
import binascii
import fcntl
import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import NotFound, SpecError
from batchyard.server import notify
from batchyard.store.models import Attempt

MAX_LOG_FILE_NAME = 200
INLINE_MAX = 64 * 1024  # bytes of a batch appended on the event loop, at most
KNOWN = 4096  # attempts whose log directory this process remembers
_append_lock = threading.Lock()
_known: OrderedDict[str, str] = OrderedDict()  # attempt uuid -> its directory
_known_lock = threading.Lock()


def _safe_name(name: str) -> str:
    if not name or len(name) > MAX_LOG_FILE_NAME or "/" in name or name.startswith(".") \
            or "\x00" in name:
        raise SpecError(f"files: {name[:60]!r} is not a log file name")
    return name


def _decoded(files_in: dict[str, Any]) -> list[tuple[str, int, bytes]]:
    out = []
    for raw_name, chunk in files_in.items():
        name = _safe_name(str(raw_name))
        try:
            offset, data = int(chunk[0]), base64.b64decode(chunk[1], validate=True)
        except (TypeError, ValueError, IndexError, binascii.Error):
            raise SpecError(f"files.{name}: expected [offset, base64 data]") from None
        out.append((name, offset, data))
    return out


def append_logs(session: Session, attempt_uuid: str,
                files_in: dict[str, Any]) -> dict[str, int]:
    """The full path: the attempt from the database, its log directory made if missing."""
    from batchyard.server.services import files  # (files imports jobs, which imports channel)

    chunks = _decoded(files_in)
    attempt = session.scalar(select(Attempt).where(Attempt.uuid == attempt_uuid))
    if attempt is None:
        raise NotFound(f"attempt {attempt_uuid} not found")
    Path(attempt.directory).parent.parent.mkdir(parents=True, exist_ok=True)
    with _append_lock:
        # A job may plant links in the server's copy (the local backend's ranks share its
        # disk): every open goes through a descriptor of the real directory, never a link.
        try:
            root = files.dir_under(attempt.directory, ["stdouterr"], create=True)
        except OSError as exc:
            raise SpecError(f"the attempt's log directory is not a plain directory: {exc}") \
                from None
        try:
            fcntl.flock(root, fcntl.LOCK_EX)  # and other server processes of this home
            sizes, grew = _append_all(root, chunks)
        finally:
            os.close(root)
    _remember(attempt_uuid, attempt.directory)
    if grew:  # (a resend that changed nothing wakes no follower)
        notify.logs_arrived(attempt_uuid)
    return sizes


def append_known(attempt_uuid: str, files_in: dict[str, Any]) -> dict[str, int] | None:
    """The fast path, or None when it does not apply (the caller takes the full path). It
    never waits: not for a lock, not for the database."""
    from batchyard.server.services import files

    with _known_lock:
        directory = _known.get(attempt_uuid)
    if directory is None:
        return None
    chunks = _decoded(files_in)
    if sum(len(data) for _name, _offset, data in chunks) > INLINE_MAX:
        return None
    if not _append_lock.acquire(blocking=False):
        return None
    try:
        try:  # an attempt deleted since: its directory is gone, and the full path says so
            root = files.dir_under(directory, ["stdouterr"])
        except OSError:
            _forget(attempt_uuid)
            return None
        try:
            try:
                fcntl.flock(root, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return None  # another server process appends there now
            sizes, grew = _append_all(root, chunks)
        finally:
            os.close(root)
    finally:
        _append_lock.release()
    if grew:
        notify.logs_arrived(attempt_uuid)
    return sizes


def _append_all(root: int, chunks: list[tuple[str, int, bytes]]) -> tuple[dict[str, int],
                                                                          bool]:
    sizes: dict[str, int] = {}
    grew = False
    for name, offset, data in chunks:
        sizes[name] = _append_at(root, name, offset, data)
        grew = grew or sizes[name] > offset
    return sizes, grew


def _append_at(root: int, name: str, offset: int, data: bytes) -> int:
    """Append ``data`` to ``root/name`` if it ends at ``offset``; the size it has after. A
    name that is not a regular single-link file (a planted link, a FIFO) takes nothing: it
    is acknowledged as taken, so the node stops resending it."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | \
        os.O_NONBLOCK
    try:
        fd = os.open(name, flags, 0o640, dir_fd=root)
    except OSError:
        return offset + len(data)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return offset + len(data)
        size = st.st_size
        if offset == size and data:
            os.write(fd, data)
            size += len(data)
        return size
    finally:
        os.close(fd)


def _remember(attempt_uuid: str, directory: str) -> None:
    with _known_lock:
        _known[attempt_uuid] = directory
        _known.move_to_end(attempt_uuid)
        while len(_known) > KNOWN:
            _known.popitem(last=False)


def _forget(attempt_uuid: str) -> None:
    with _known_lock:
        _known.pop(attempt_uuid, None)
