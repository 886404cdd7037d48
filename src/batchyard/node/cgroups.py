"""A job's ``pids.max`` on one node: a cgroup of its own (``batchyard/<attempt>-<node>``
under the pids controller: cgroup v2's unified hierarchy where it has that controller, else
v1's ``pids`` hierarchy), which every job process joins before anything else (node/sandbox.py
writes its pid into ``cgroup.procs``), so a fork bomb stops at the limit instead of taking the
node, and the server on a local cluster, with it. ``pids.events`` counts the forks refused:
the launcher fails the job once there is one. Where no cgroup can be made (not root, a
read-only cgroup file system) the launcher's log says so and the job runs without the limit.
Standard library only (the launcher runs under ``python -S``)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
TOP = "batchyard"


def _hierarchy() -> tuple[Path, bool] | None:
    """(the pids hierarchy's root, whether it is cgroup v2)."""
    for root in (ROOT, ROOT / "unified"):
        with contextlib.suppress(OSError):
            if "pids" in (root / "cgroup.controllers").read_text().split():
                return root, True
    if (ROOT / "pids" / "cgroup.procs").exists():
        return ROOT / "pids", False
    return None


def _enable(folder: Path) -> None:
    """cgroup v2: a folder's children get the pids controller."""
    with contextlib.suppress(OSError):
        if "pids" not in (folder / "cgroup.subtree_control").read_text().split():
            (folder / "cgroup.subtree_control").write_text("+pids")


def name_of(tag: str) -> str:
    return tag.replace("/", "-")


class JobCgroup:
    """One attempt's cgroup on one node."""

    def __init__(self, tag: str, limit: int) -> None:
        self.tag, self.limit = tag, limit
        self.path: Path | None = None

    def create(self) -> str | None:
        """None once it is there with its limit, else why it could not be."""
        found = _hierarchy()
        if found is None:
            return "no pids controller under /sys/fs/cgroup"
        root, v2 = found
        try:
            if v2:
                _enable(root)
            (root / TOP).mkdir(exist_ok=True)
            if v2:
                _enable(root / TOP)
            path = root / TOP / name_of(self.tag)
            path.mkdir(exist_ok=True)
            (path / "pids.max").write_text(str(self.limit))
        except OSError as exc:
            return f"{root / TOP}: {exc.strerror or exc}"
        self.path = path
        return None

    @property
    def procs(self) -> str | None:
        return str(self.path / "cgroup.procs") if self.path is not None else None

    def refused(self) -> int:
        """Forks refused at the limit so far (``pids.events``: ``max N``)."""
        if self.path is None:
            return 0
        try:
            text = (self.path / "pids.events").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and value.strip().isdigit():
                return int(value)
        return 0

    def peak(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            if self.path is not None:
                return int((self.path / "pids.peak").read_text())
        return None

    def remove(self, wait: float = 5.0) -> None:
        """Once its processes are gone (the teardown killed them): the folder goes."""
        if self.path is not None:
            remove(self.path, wait)
            self.path = None


def remove(path: Path, wait: float = 5.0) -> None:
    deadline = time.monotonic() + wait
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def remove_for(tag: str) -> None:
    """What a launcher killed without its teardown left (the backend's sweep)."""
    found = _hierarchy()
    if found is not None:
        remove(found[0] / TOP / name_of(tag), wait=2.0)


def join(procs: str) -> None:
    """This process (and so all it starts) into the job's cgroup (sandbox.py, as root)."""
    fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
