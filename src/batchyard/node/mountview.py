"""The job's view of the file system, made in a private mount namespace by every job process
before it ``exec``s its command (node/sandbox.py runs :func:`enter`; standard library only:
it runs as a script under ``python -I -S``).

In that order:

1. The folders to show (the job's own, read-write; the interpreter, batchyard's package,
   its inputs, read-only) are cloned as detached mount trees (``open_tree``), as they are.
2. Everything is made read-only (``mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY)`` on
   ``/``): ``/``, ``/etc``, ``/usr``, the virtualenv, batchyard's own files, the homes.
3. ``/tmp`` and ``/dev/shm`` become the job's own (a folder per attempt and node, shared by
   its processes there and by nobody else).
4. An empty tmpfs covers each hidden folder (the server's home and data root, the node's
   work folder, folders the job's uid could not pass anyway), a credential file outside
   them is covered by ``/dev/null``, and the clones of step 1 are put back at their paths.
5. ``/etc/passwd`` and ``/etc/group`` show the job's account (node/jobuser.py).

The kernel keeps it so: mounts copied into a user namespace the job might make are locked
(no unmounting one to look beneath, no remounting read-write), and the job holds no
capability. Where the kernel lacks these calls (before 5.12) it raises, and the launcher
falls back to the view without step 2.
"""

from __future__ import annotations

import ctypes
import os

AT_FDCWD = -100
AT_EMPTY_PATH, AT_RECURSIVE = 0x1000, 0x8000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # every architecture's
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
_LOCKED_FLAGS = 2 | 4 | 8 | 1024 | 2048 | 4096  # ST_NOSUID..ST_RELATIME == MS_* values


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class View:
    """The mount calls, on one libc."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long

    def fail(self, call: str) -> None:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{call}: {os.strerror(errno)}")

    def mount(self, source: str | None, target: str, kind: str | None, flags: int,
              data: str | None = None) -> None:
        if self.libc.mount(source and source.encode(), target.encode(),
                           kind and kind.encode(), flags, data and data.encode()) != 0:
            self.fail(f"mount {target}")

    def clone(self, path: str) -> int:
        """A detached copy of the mount tree at ``path`` (``open_tree``)."""
        fd = self.libc.syscall(ctypes.c_long(SYS_OPEN_TREE), AT_FDCWD, path.encode(),
                               OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
        if fd < 0:
            self.fail(f"open_tree {path}")
        return int(fd)

    def read_only(self, path: str = "", fd: int = AT_FDCWD, recursive: bool = True,
                  on: bool = True) -> None:
        attr = MountAttr(MOUNT_ATTR_RDONLY if on else 0, 0 if on else MOUNT_ATTR_RDONLY, 0, 0)
        flags = (AT_RECURSIVE if recursive else 0) | (AT_EMPTY_PATH if not path else 0)
        if self.libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), fd, path.encode(), flags,
                             ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
            self.fail(f"mount_setattr {path or fd}")

    def attach(self, fd: int, target: str) -> None:
        if self.libc.syscall(ctypes.c_long(SYS_MOVE_MOUNT), fd, b"", AT_FDCWD,
                             target.encode(), MOVE_MOUNT_F_EMPTY_PATH) != 0:
            self.fail(f"move_mount {target}")


def _place(path: str, folder: bool) -> None:
    """A mount point at ``path``: made where it is missing (in the job's /tmp, on a tmpfs)."""
    if folder:
        os.makedirs(path, exist_ok=True)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))


def enter(spec: dict[str, object], view: View | None = None) -> None:
    """In this process's own mount namespace (made already): the job's view. Read-only
    (``spec["readonly"]``) needs ``open_tree``, ``move_mount`` and ``mount_setattr``."""
    v = view or View()
    get = spec.get
    readonly = bool(get("readonly"))
    v.mount(None, "/", None, MS_REC | MS_PRIVATE)
    shown: list[tuple[int, str, bool, bool]] = []  # (tree or O_PATH fd, path, ro, is dir)
    for path, mode in get("binds") or []:  # type: ignore[attr-defined]
        try:
            fd = v.clone(path) if readonly else os.open(path, os.O_PATH | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there (an output never made): nothing to show
        if readonly and mode == "ro":
            v.read_only(fd=fd)
        shown.append((fd, path, mode == "ro", os.path.isdir(path)))
    own = {}
    for where in ("tmp", "shm"):
        if get(where):
            own[where] = v.clone(str(get(where))) if readonly else os.open(
                str(get(where)), os.O_PATH | os.O_CLOEXEC)
    if readonly:
        v.read_only("/")
    if get("proc"):  # the PID namespace's own (node/pidns.py)
        v.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    elif readonly:
        v.read_only("/proc", recursive=False, on=False)
    for where, target in (("tmp", "/tmp"), ("shm", "/dev/shm")):
        if where in own:
            _put(v, own[where], target, True, readonly)
    for hidden in get("hide") or []:  # type: ignore[attr-defined]
        try:
            _place(str(hidden), True)
        except OSError:
            continue  # (under a read-only folder it is not there to hide)
        v.mount("tmpfs", str(hidden), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for path in get("hide_files") or []:  # type: ignore[attr-defined]
        if os.path.isfile(str(path)):
            v.mount("/dev/null", str(path), None, MS_BIND)
    for fd, path, ro, folder in sorted(shown, key=lambda s: s[1].count("/")):
        _place(path, folder)
        _put(v, fd, path, folder, readonly)
        if ro and not readonly:
            flags = os.statvfs(path).f_flag & _LOCKED_FLAGS
            v.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    for source, alias in get("aliases") or []:  # type: ignore[attr-defined]
        if os.path.isdir(source):
            os.makedirs(alias, exist_ok=True)
            v.mount(source, alias, None, MS_BIND | MS_REC)
    for name, path in (get("etc") or {}).items():  # type: ignore[attr-defined]
        v.mount(str(path), f"/etc/{name}", None, MS_BIND)
        if not readonly:
            v.mount(None, f"/etc/{name}", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    if readonly:
        for hidden in get("hide") or []:  # type: ignore[attr-defined]
            if os.path.ismount(str(hidden)):
                v.read_only(str(hidden), recursive=False)


def _put(v: View, fd: int, path: str, folder: bool, tree: bool) -> None:
    """A clone (``tree``) or a folder opened ``O_PATH`` shown at ``path``."""
    if tree:
        v.attach(fd, path)
    else:
        v.mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    os.close(fd)
