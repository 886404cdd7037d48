"""Shared low-level helpers of the container kit (tests/containerkit.py): its paths and
constants, environment cleaning, build steps, locks, pids, mounts and private dirs."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "containers"
CACHE = Path(os.environ.get("BATCHYARD_TEST_CACHE", "/var/cache/batchyard-tests"))
DOCKER_STORE = Path("/var/lib/batchyard-test-docker")
DOCKER_RUN = Path("/run/batchyard-test-docker")  # exec root: short, for unix socket paths
PODMAN_STORE = Path("/var/lib/batchyard-test-podman")
PODMAN_RUN = Path("/run/batchyard-test-podman")
KIT_VERSION = "1"  # part of every image hash: bump to rebuild all cached images
SUITE = "bookworm"  # python3 3.11, like the venv: the cp311 wheels fit
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REPO_PREFIX = "local/batchyard-"
USER = "batchyard"
_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
# variables that would point our commands at some other engine, store or registry login
_FOREIGN_ENV = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_TLS_VERIFY",
                "DOCKER_CERT_PATH", "DOCKER_API_VERSION", "DOCKER_BUILDKIT", "CONTAINER_HOST",
                "CONTAINER_CONNECTION", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF",
                "CONTAINERS_REGISTRIES_CONF", "REGISTRY_AUTH_FILE")


# -- small helpers ----------------------------------------------------------------------------

def _which(name: str) -> str | None:
    return shutil.which(name, path=_SBIN_PATH)


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_ENV}
    env["PATH"] = _SBIN_PATH
    env.update(extra or {})
    return env


def _sh(argv: Sequence[str | Path], timeout: float = 600, input: str | None = None,
        env: Mapping[str, str] | None = None, what: str | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a build/setup step; fail loudly with the tail of its output."""
    args = [str(a) for a in argv]
    p = subprocess.run(args, input=input, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                       env=_clean_env(env), stdin=None if input is not None else subprocess.DEVNULL)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-25:])
        raise RuntimeError(f"{what or shlex.join(args)} failed (rc {p.returncode}):\n{tail}")
    return p


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM when the test process dies (even by SIGKILL)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _flock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive lock on ``path``; yields False (without waiting) if busy and not blocking."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class _HeldLock:
    """A non-blocking flock held until release(): marks a persistent store as in use."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh: Any = open(path, "a")  # noqa: SIM115 - held for the session
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.held = True
        except BlockingIOError:
            self.fh.close()
            self.held = False

    def release(self) -> None:
        if self.held:
            self.held = False
            self.fh.close()


def _cmdline(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    return []


def _pids_mentioning(paths: Sequence[Path]) -> list[int]:
    """Processes whose argv names one of our private dirs (containerd, shims, conmon)."""
    needles = [str(p) for p in paths]
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            cmd = "\0".join(_cmdline(int(entry.name)))
            if any(n in cmd for n in needles):
                found.append(int(entry.name))
    return found


def _kill_pids(pids: Sequence[int], grace: float = 5.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                alive.append(pid)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if Path(f"/proc/{p}").exists() and not _zombie(p)]
            time.sleep(0.05)
        if not alive:
            return
        pids = alive


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def _umount_under(dirs: Sequence[Path]) -> None:
    """Lazily unmount whatever is mounted at/below ``dirs`` (deepest first), from mountinfo."""
    prefixes = [str(d) for d in dirs]
    with open("/proc/self/mountinfo") as f:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
                  for line in f]
    for mp in reversed(points):
        if any(mp == p or mp.startswith(p + "/") for p in prefixes):
            subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)


def _owner_id(pid: int) -> str:
    """pid plus start time, so a recycled pid or a zombie counts as dead."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "dead"
    return "dead" if fields[0] in "ZX" else f"{pid} {fields[19]}"


_OWNER = ".containerkit-owner"


def _stale_places() -> list[tuple[Path, str]]:
    return [(Path(tempfile.gettempdir()), "containerkit-"), (Path("/run"), "bytd-"),
            (Path("/run"), "bytp-"), (CACHE / "build", "build-")]


def _reap_stale() -> None:
    """Private dirs of sessions that died without cleaning up (SIGKILL, crashed CI): their
    daemons died with them (PR_SET_PDEATHSIG); strays naming the dir are killed by pid, its
    mounts undone, the dir removed."""
    for parent, prefix in _stale_places():
        for d in parent.glob(prefix + "*"):
            try:
                owner = (d / _OWNER).read_text().split()
            except OSError:
                with contextlib.suppress(OSError):  # just made, owner not written yet?
                    if time.time() - d.stat().st_mtime < 600:
                        continue
                owner = []
            if not owner or _owner_id(int(owner[0])) != " ".join(owner):
                if strays := _pids_mentioning([d]):
                    _kill_pids(strays)
                _umount_under([d])
                shutil.rmtree(d, ignore_errors=True)


def _private_dir(prefix: str, parent: Path | None = None) -> Path:
    """A fresh temp dir owned by this process (see _reap_stale)."""
    _reap_stale()
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (d / _OWNER).write_text(_owner_id(os.getpid()) + "\n")
    return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _root_reason() -> str | None:
    return None if os.geteuid() == 0 else "container tests need root"
