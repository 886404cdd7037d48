"""Help pages kept once printed (issue 37: `batchyard --help` took ~9x Python's start, most
of it importing Typer and Rich and laying the page out). A help page is a function of the
command line, the terminal (whether each standard stream is one, its size, its encoding), the
environment variables Typer and Rich read, and the code that makes it (batchyard's, Typer's
and Rich's files): the first run of a help command in such a setting prints it the usual way
and keeps the bytes it wrote (`recording`), under a key made of all of that; a later run with
the same key writes those bytes and exits, without importing Typer or Rich (`replay`).

Only what was seen to be help is kept: Typer rendered a help page, the command exited 0 and
wrote nothing on stderr. Completion (``_BATCHYARD_COMPLETE``) is never cached. The pages
live in ``$XDG_CACHE_HOME/batchyard/help`` (``~/.cache/...``), each file holding its key;
anything unreadable is a miss. A page is replayed only from a folder and a file that are this
user's and that nobody else may write (`_private`): another user must not be able to put
words in a help page, nor point a page at a file of theirs (no link is followed)."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

HELP_FLAGS = ("-h", "--help")
# environment that may change a help page (Rich's and Typer's terminal settings, batchyard's)
VARS = ("COLUMNS", "LINES", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE",
        "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "JUPYTER_LINES", "SHELL", "LANG", "LC_ALL",
        "LC_CTYPE", "PYTHONIOENCODING", "PYTHONUTF8", "CLICOLOR", "CLICOLOR_FORCE")
PREFIXES = ("BATCHYARD", "_BATCHYARD", "TYPER", "_TYPER", "RICH")
LIBRARIES = ("typer", "rich", "click", "shellingham")
MAX_PAGES = 400  # kept pages; past this the folder is emptied and filled again
SEP = b"\0\n"


def wanted(args: list[str]) -> bool:
    """Whether ``args`` may be a help command (a help flag before any ``--``)."""
    for arg in args:
        if arg == "--":
            return False
        if arg in HELP_FLAGS:
            return True
    return False


def folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "batchyard", "help")


def _stats(directory: str) -> Iterator[str]:
    """Each .py file under ``directory``: name, size, mtime."""
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    stack.append(entry.path)
            elif entry.name.endswith(".py"):
                st = entry.stat()
                yield f"{entry.path} {st.st_size} {st.st_mtime_ns}"


def key(args: list[str]) -> str:
    """Everything a help page of ``args`` depends on, as text."""
    import batchyard

    parts = [batchyard.__version__, sys.version, sys.executable, repr(args)]
    parts += sorted(f"{k}={v!r}" for k, v in os.environ.items()
                    if k in VARS or k.startswith(PREFIXES))
    for fd in (0, 1, 2):
        try:
            size = os.get_terminal_size(fd) if os.isatty(fd) else None
        except OSError:
            size = None
        parts.append(f"fd{fd} {os.isatty(fd)} {size}")
    parts.append(f"encoding {getattr(sys.stdout, 'encoding', None)} "
                 f"{getattr(sys.stdout, 'errors', None)}")
    parts += _stats(os.path.dirname(batchyard.__file__))
    for name in LIBRARIES:
        for entry in sys.path:
            init = os.path.join(entry or ".", name, "__init__.py")
            try:
                st = os.stat(init)
            except OSError:
                continue
            parts.append(f"{init} {st.st_size} {st.st_mtime_ns}")
            parts += _stats(os.path.dirname(init))
            break
    return "\n".join(parts)


def _file(text: str) -> str:
    import zlib

    data = text.encode("utf-8", "surrogateescape")
    return os.path.join(folder(), f"{zlib.crc32(data):08x}{len(data):x}")


def _private(st: os.stat_result) -> bool:
    """Whether what ``st`` describes is this user's and writable by nobody else."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _private_folder(path: str) -> bool:
    """``path`` and the folder above it (batchyard's cache) are real folders (no link),
    this user's, writable by nobody else."""
    import stat

    try:
        for each in (path, os.path.dirname(path)):
            st = os.lstat(each)
            if not stat.S_ISDIR(st.st_mode) or not _private(st):
                return False
    except OSError:
        return False
    return True


def _read(path: str) -> bytes | None:
    """The file at ``path`` when it is a regular file of this user's that nobody else may
    write, in a folder like it; else None."""
    import stat

    if not _private_folder(os.path.dirname(path)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or not _private(st):
            return None
        return fh.read()


def replay(args: list[str]) -> bool:
    """Write the kept help page of ``args`` (True), or nothing (False: not kept)."""
    if os.environ.get("_BATCHYARD_COMPLETE") or not wanted(args):
        return False
    try:
        text = key(args)
        data = _read(_file(text))
    except (OSError, ValueError):
        return False
    if data is None:
        return False
    stored, sep, page = data.partition(SEP)
    if not sep or stored != text.encode("utf-8", "surrogateescape"):
        return False
    out = sys.stdout.buffer
    out.write(page)
    out.flush()
    return True


class _Tee:
    """A standard stream that keeps a copy of what is written through it (text and, through
    ``buffer``, bytes) in the order written."""

    def __init__(self, stream: Any, log: list[bytes], binary: bool = False) -> None:
        self._stream = stream
        self._log = log
        self._binary = binary

    def write(self, data: Any) -> Any:
        written = self._stream.write(data)  # first: Click probes a stream with b"" (refused)
        if self._binary:
            self._log.append(bytes(data))
        else:
            self._log.append(str(data).encode(self._stream.encoding or "utf-8",
                                              self._stream.errors or "strict"))
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    @property
    def buffer(self) -> Any:
        return _Tee(self._stream.buffer, self._log, binary=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class recording:
    """``with recording(args) as rec: run(); rec.done(code)``: keeps the help page the
    command printed (see the module's doc)."""

    def __init__(self, args: list[str]) -> None:
        self.args = list(args)
        self.active = wanted(self.args) and not os.environ.get("_BATCHYARD_COMPLETE")
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.helped = False
        self._saved: Any = None
        self._key = ""

    def __enter__(self) -> recording:
        if not self.active:
            return self
        self._key = key(self.args)  # before the command runs (--ca-file sets a variable)
        try:
            from typer import core
        except ImportError:  # pragma: no cover
            self.active = False
            return self
        self._saved = (sys.stdout, sys.stderr, [(cls, cls.__dict__.get("format_help"))
                                                for cls in (core.TyperCommand,
                                                            core.TyperGroup)])
        for cls, real in self._saved[2]:
            if real is None:
                continue

            def format_help(this: Any, *a: Any, _real: Any = real, **kw: Any) -> Any:
                self.helped = True
                return _real(this, *a, **kw)

            cls.format_help = format_help
        sys.stdout = _Tee(sys.stdout, self.out)
        sys.stderr = _Tee(sys.stderr, self.err)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.active or self._saved is None:
            return
        sys.stdout, sys.stderr, classes = self._saved
        for cls, real in classes:
            if real is not None:
                cls.format_help = real
        code = _code(exc[1]) if exc[0] is not None else 0
        if self.helped and code == 0 and not any(self.err) and any(self.out):
            self._store(b"".join(self.out))

    def _store(self, page: bytes) -> None:
        try:
            text = self._key
            path = _file(text)
            where = os.path.dirname(path)
            for each in (os.path.dirname(where), where):  # both 0700 (makedirs: the umask's)
                if not os.path.isdir(each):
                    os.makedirs(each, mode=0o700)
            if not _private_folder(where):  # someone else's: leave it
                return
            names = os.listdir(where)
            if len(names) >= MAX_PAGES:
                for name in names:
                    os.unlink(os.path.join(where, name))
            tmp = f"{path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                         | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(text.encode("utf-8", "surrogateescape") + SEP + page)
            os.replace(tmp, path)
        except OSError:
            pass


def _code(exc: BaseException | None) -> int | None:
    if isinstance(exc, SystemExit):
        code = exc.code
        return 0 if code is None else code if isinstance(code, int) else 1
    return None if exc is None else 1
