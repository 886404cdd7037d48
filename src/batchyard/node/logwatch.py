"""Wake-ups for the log shipper (standard library only: the launcher runs under ``python -S``).

The shipper looked at its log directory every 50 ms whether a rank wrote or not: a line
waited 25 ms on average before it was even seen, and an idle launcher woke 20 times a second.
Here it sleeps in ``poll`` on an inotify descriptor of the directory (through ctypes) and on a
pipe other threads write to (``wake``), so it runs the moment a rank writes or a file
appears. Where inotify is not available (no such call, the per-user limit of instances
reached) the caller polls on a short timeout: ``watching`` says which."""

from __future__ import annotations

import contextlib
import os
import select
import struct
import threading
import time

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000  # a link a rank put in place of the directory is not watched
MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF \
    | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED


def _inotify(path: str, mask: int = MASK) -> int | None:
    """A non-blocking inotify descriptor watching ``path``; None where there is none."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
        os.close(fd)
        return None
    return fd


class DirWatch:
    """``wait`` returns once the directory may have changed, ``wake()`` was called, or the
    timeout passed; ``changed()`` then takes what inotify saw and says whether any of it
    concerns a file the shipper sends (a dot file, such as the SDK's heartbeat, does not)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._fd: int | None = None
        self._path: str | None = None
        self._wakes = select.poll()
        self._wakes.register(self._read, select.POLLIN)
        self._both = select.poll()
        self._both.register(self._read, select.POLLIN)
        self._lock = threading.Lock()  # wake() from other threads never writes to a closed fd
        self._closed = False

    @property
    def watching(self) -> bool:
        return self._fd is not None

    def watch(self, path: str) -> bool:
        """Watch ``path`` (the directory itself, not its subdirectories); False: no inotify
        here, so the caller polls."""
        if path == self._path and self._fd is not None:
            return True
        self._forget()
        fd = _inotify(path)
        if fd is not None:
            self._fd, self._path = fd, path
            self._both.register(fd, select.POLLIN)
        return fd is not None

    def watch_fd(self, fd: int) -> bool:
        """Watch the directory open at ``fd`` (the shipper holds its log folder open): the
        folder itself, through /proc, whatever was renamed or linked in its place since."""
        path = f"/proc/self/fd/{fd}"
        self._forget()
        found = _inotify(path, MASK & ~IN_DONT_FOLLOW)
        if found is not None:
            self._fd, self._path = found, path
            self._both.register(found, select.POLLIN)
        return found is not None

    def wake(self) -> None:
        with self._lock:
            if not self._closed:
                with contextlib.suppress(OSError):  # (a full pipe is woken already)
                    os.write(self._write, b"!")

    def wait(self, timeout: float, *, changes: bool = True) -> bool:
        """Sleep until a wake-up, a change (unless ``changes`` is False: then only a wake-up
        ends it early) or ``timeout``. True if it was woken; changes stay queued for
        ``changed``."""
        poller = self._both if changes else self._wakes
        end = time.monotonic() + max(timeout, 0.0)
        while True:
            left = end - time.monotonic()
            try:
                ready = poller.poll(max(0, int(left * 1000 + 0.999)))
            except InterruptedError:
                ready = []
            if any(fd == self._read for fd, _ in ready):
                with contextlib.suppress(OSError):
                    os.read(self._read, 4096)
                return True
            if ready or left <= 0:
                return False

    def changed(self) -> bool:
        """Take every queued event; True if one was about a file that is not a dot file
        (or events were lost: the queue overflowed). The directory removed or moved drops
        the watch (``watching`` turns False) and counts as a change."""
        if self._fd is None:
            return False
        seen = gone = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                gone = True
                break
            if not data:
                break
            at = 0
            while at + _EVENT.size <= len(data):
                _wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size:at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                if mask & _GONE:
                    gone = True
                elif mask & IN_Q_OVERFLOW or (name and not name.startswith(b".")):
                    seen = True
        if gone:
            self._forget()
        return seen or gone

    def _forget(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._both.unregister(self._fd)
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._path = None, None

    def close(self) -> None:
        self._forget()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._read, self._write):
                with contextlib.suppress(OSError):
                    os.close(fd)
