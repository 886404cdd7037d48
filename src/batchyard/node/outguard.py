"""Reading a job's output folder without leaving it. The upload runs outside the sandbox,
as the launcher's user: a link a rank planted (to the server's token, the database,
``/etc/shadow``, the node's credential) must never be followed out of the folder, and an
output folder that is itself a link (to ``/etc``) is not read at all.

Every folder is walked through descriptors (``os.fwalk``, links not followed) and every
file opened relative to its folder's descriptor with ``O_NOFOLLOW``, so nothing the job
renames meanwhile leads elsewhere; a link to a file is opened with ``openat2`` and
``RESOLVE_BENEATH`` from the output folder, so only one that stays inside it is read (as
the file it names). Links that lead out of the folder, to a folder, or nowhere are skipped,
and named (``Walk.skipped``) for the launcher's log. Standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS, RESOLVE_BENEATH = 0x02, 0x08
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def open_beneath(root_fd: int, rel: str) -> int:
    """``rel`` opened for reading from ``root_fd``, links followed only while they stay
    beneath it (``openat2``); OSError(EXDEV) when one leads out."""
    how = _OpenHow(os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, 0,
                   RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), root_fd, rel.encode(), ctypes.byref(how),
                       ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), rel)
    return int(fd)


@dataclass
class Walk:
    """The files of one output folder; ``skipped``: what was not read, and why."""

    root: str
    skipped: list[str] = field(default_factory=list)

    def files(self) -> Iterator[tuple[str, int]]:
        """(path relative to the folder, a descriptor open for reading) of every regular
        file it holds; the caller closes each descriptor."""
        try:
            st = os.lstat(self.root)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            self.skipped.append(f"{self.root}: the output folder is a link (to "
                                f"{os.readlink(self.root)}): not uploaded")
            return
        if not stat.S_ISDIR(st.st_mode):
            return
        root_fd = os.open(self.root, _DIR)
        try:
            for folder, dirs, names, dir_fd in os.fwalk(".", dir_fd=root_fd,
                                                         follow_symlinks=False):
                for name in dirs:  # (a link to a folder is listed here, never entered)
                    if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                        self._folder_link(os.path.normpath(os.path.join(folder, name)),
                                          os.readlink(name, dir_fd=dir_fd))
                for name in sorted(names):
                    rel = os.path.normpath(os.path.join(folder, name))
                    fd = self._open(root_fd, dir_fd, name, rel)
                    if fd is not None:
                        yield rel, fd
        finally:
            os.close(root_fd)

    def _open(self, root_fd: int, dir_fd: int, name: str, rel: str) -> int | None:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return self._link(root_fd, dir_fd, name, rel)
        if not stat.S_ISREG(st.st_mode):
            return None  # a FIFO, a socket, a device: no output
        try:
            fd = os.open(name, _FILE, dir_fd=dir_fd)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # (replaced meanwhile)
            os.close(fd)
            return None
        return fd

    def _link(self, root_fd: int, dir_fd: int, name: str, rel: str) -> int | None:
        target = os.readlink(name, dir_fd=dir_fd)
        where = os.path.normpath(os.path.join(os.path.dirname(rel), target)) \
            if not os.path.isabs(target) else None
        if where is None:  # absolute: inside the folder only if it names a place in it
            real_root = os.path.realpath(self.root)
            found = os.path.realpath(os.path.join(self.root, rel))
            if found == real_root or not found.startswith(real_root + "/"):
                self._skip(rel, target, "leads out of the output folder")
                return None
            where = os.path.relpath(found, real_root)
        try:
            fd = open_beneath(root_fd, where)
        except OSError as exc:
            why = ("leads out of the output folder" if exc.errno in (errno.EXDEV, errno.ELOOP)
                   or where.startswith("..") else "leads nowhere")
            self._skip(rel, target, why)
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self._skip(rel, target, "is not a file")
            return None
        return fd

    def _folder_link(self, rel: str, target: str) -> None:
        inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
        out = os.path.isabs(target) or inside == ".." or inside.startswith("../")
        self._skip(rel, target, "leads out of the output folder" if out else
                   "names a folder (not followed)")

    def _skip(self, rel: str, target: str, why: str) -> None:
        self.skipped.append(f"{rel} -> {target}: a link that {why}: skipped")


def size(root: str, stop_at: int | None = None) -> int:
    """Bytes of the regular files under ``root`` (links not followed), counted until
    ``stop_at`` is passed."""
    total = 0
    stack = [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
        if stop_at is not None and total > stop_at:
            break
    return total
