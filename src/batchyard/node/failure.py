"""Why a rank, a step or a node failed, in plain words: a cause class from the exit status,
the kernel's OOM evidence and the tail of what the process printed, and the few lines a user
needs to see (the Python exception, else the last lines of stderr). Pure and standard library
only: the launcher runs under ``python -S``, and the server builds its own causes (node lost,
preempted) with the same record shape (batchyard/failure_record.py)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from batchyard.failure_record import (  # the record's shape, shared with the server
    CAUSES as CAUSES,
)
from batchyard.failure_record import (
    HUNG as HUNG,
)
from batchyard.failure_record import (
    IMAGE_PULL as IMAGE_PULL,
)
from batchyard.failure_record import (
    MAX_BYTES as MAX_BYTES,
)
from batchyard.failure_record import (
    MAX_LINE as MAX_LINE,
)
from batchyard.failure_record import (
    MAX_LINES as MAX_LINES,
)
from batchyard.failure_record import (
    NODE_LOST as NODE_LOST,
)
from batchyard.failure_record import (
    OOM as OOM,
)
from batchyard.failure_record import (
    OUTPUT_LIMIT as OUTPUT_LIMIT,
)
from batchyard.failure_record import (
    PIDS_LIMIT as PIDS_LIMIT,
)
from batchyard.failure_record import (
    PREEMPTED as PREEMPTED,
)
from batchyard.failure_record import (
    PREPARATION as PREPARATION,
)
from batchyard.failure_record import (
    SUMMARY as SUMMARY,
)
from batchyard.failure_record import (
    TIMEOUT as TIMEOUT,
)
from batchyard.failure_record import (
    USER as USER,
)
from batchyard.failure_record import (
    WALL_CLOCK as WALL_CLOCK,
)
from batchyard.failure_record import (
    clean as clean,
)
from batchyard.failure_record import (
    error_lines as error_lines,
)
from batchyard.failure_record import (
    exception_line as exception_line,
)
from batchyard.failure_record import (
    first as first,
)
from batchyard.failure_record import (
    meaningful as meaningful,
)
from batchyard.failure_record import (
    message_of as message_of,
)
from batchyard.failure_record import (
    record as record,
)
from batchyard.failure_record import (
    signal_name as signal_name,
)
from batchyard.failure_record import (
    signal_of as signal_of,
)
from batchyard.failure_record import (
    summary_of as summary_of,
)
from batchyard.node import proctree
from batchyard.node.pidns import forwarded

TAIL_READ = 64 * 1024

_OOM_TEXT = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|"
    r"^MemoryError\b|std::bad_alloc|Cannot allocate memory|Killed process \d+.*oom", re.M)
_TIMEOUT_TEXT = re.compile(
    r"Timed out waiting \d+ ?ms for (?:recv|send)|DistStoreError: .*Timed out|"
    r"Watchdog caught collective operation timeout|NCCL.*[Tt]ime ?out|"
    r"failed to pass monitoredBarrier|Socket Timeout|"
    r"torch\.distributed\.\w*(?:Timeout|TimeoutError)|Gloo.*[Tt]imed out")
_KILLED = re.compile(r"Killed process (\d+)|oom-kill:.*?\bpid=(\d+)")


def read_tail(path: Path, limit: int = TAIL_READ) -> list[str]:
    """The last lines of a log file, decoded leniently; [] when it is missing."""
    try:  # (never through a link a rank put in its own log's place)
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > limit and lines:
        lines = lines[1:]  # the first line read is a cut one
    return clean(lines)


def classify(code: int | None, lines: list[str], oom_killed: bool = False) -> str:
    """The cause class of a process that ended with ``code`` after printing ``lines``."""
    text = "\n".join(lines)
    if oom_killed or _OOM_TEXT.search(text):
        return OOM
    exception = exception_line(lines) or ""
    if exception.startswith("MemoryError") or "OutOfMemoryError" in exception:
        return OOM
    if _TIMEOUT_TEXT.search(text):
        return TIMEOUT
    number = signal_of(code)
    if number is not None and not exception:
        return f"signal {number}"
    return USER


def rank_error(rank: int, code: int, node: str, node_rank: int, logs: list[Path],
               oom_killed: bool = False, at: float | None = None) -> dict[str, Any]:
    """A rank that exited non-zero: its stderr's tail (its stdout's when stderr is empty)."""
    lines: list[str] = []
    for path in logs:
        lines = read_tail(path)
        if path.name.endswith("-mpirun.stderr.txt"):  # its crash in teardown is aftermath
            lines = meaningful(lines, mpirun_log=True)
        if any(line.strip() for line in lines):
            break
    cause = classify(code, lines, oom_killed)
    return record(cause, node=node, node_rank=node_rank, rank=rank, exit_code=code,
                  lines=lines, what="rank", at=at)


# --- OOM evidence ------------------------------------------------------------------------

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")  # (the unit tests point these at a made-up tree)


def memory_cgroups(pid: int) -> list[Path]:
    """The memory cgroup directories of a process (v1 memory controller, v2 unified)."""
    try:
        with open(PROC / str(pid) / "cgroup") as fh:
            entries = fh.read().splitlines()
    except OSError:
        return []
    out = []
    for entry in entries:
        parts = entry.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1].split(","), parts[2].lstrip("/")
        if "memory" in controllers:
            out.append(CGROUP_ROOT / "memory" / path)
        elif parts[0] == "0":
            for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
                if (root / path / "memory.events").exists():
                    out.append(root / path)
                    break
    return out


def oom_kills(cgroup: Path) -> int | None:
    """The cgroup's OOM-kill counter (v2 memory.events, v1 memory.oom_control)."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(cgroup / name) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def kernel_oom_pids(since_monotonic: float) -> set[int]:
    """Pids the kernel's OOM killer killed since then, from /dev/kmsg where readable."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return set()
    found: set[int] = set()
    try:
        for _ in range(1 << 20):  # records in the ring buffer; bounded whatever it answers
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not raw:
                break
            head, _, text = raw.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            try:
                if len(fields) > 2 and int(fields[2]) / 1e6 < since_monotonic:
                    continue
            except ValueError:
                continue
            match = _KILLED.search(text)
            if match:
                found.add(int(match.group(1) or match.group(2)))
    finally:
        os.close(fd)
    return found


class OomWatch:
    """Follows the memory cgroups a node's ranks run in, so a rank killed by SIGKILL can be
    told apart from one the OOM killer ended (a counter that rose, or the kernel's log)."""

    LOOK_EVERY = 0.5

    def __init__(self) -> None:
        self.since = time.monotonic() - 1.0
        self._base: dict[Path, int] = {}
        self._of: dict[int, set[Path]] = {}
        self._looked = 0.0

    def look(self, pids: list[int], force: bool = False) -> None:
        if not force and time.monotonic() - self._looked < self.LOOK_EVERY:
            return
        self._looked = time.monotonic()
        for pid in pids:
            child = forwarded(pid)  # a sandbox's forwarder: the job's process is its child
            for cgroup in memory_cgroups(pid) + (memory_cgroups(child) if child else []):
                self._of.setdefault(pid, set()).add(cgroup)
                if cgroup not in self._base:
                    self._base[cgroup] = oom_kills(cgroup) or 0

    def killed(self, pid: int, code: int) -> bool:
        if signal_of(code) != signal.SIGKILL:
            return False
        for cgroup in self._of.get(pid, set()):
            count = oom_kills(cgroup)
            if count is not None and count > self._base.get(cgroup, 0):
                return True
        killed = kernel_oom_pids(self.since)  # (the forwarder's child is the one named)
        return pid in killed or proctree.forwarders.get(pid, pid) in killed


def node_error(state: str, extra: dict[str, Any], node: str, node_rank: int,
               ran: bool) -> dict[str, Any] | None:
    """The error of a node's share that failed without a rank's own (staging, the image, the
    launcher itself): its cause as the step named it, else preparation when no rank ran."""
    if state not in ("failed", "timeout") or extra.get("error"):
        return extra.get("error")
    cause = extra.get("cause") or (WALL_CLOCK if state == "timeout" else None)
    if cause is None and ran:
        return None
    message = str(extra.get("message") or state)
    return record(cause or PREPARATION, node=node, node_rank=node_rank,
                  exit_code=extra.get("exit_code"), lines=message.splitlines()[-MAX_LINES:],
                  summary=message.splitlines()[-1] if message else None, what="node")
