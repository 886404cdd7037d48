"""Why a rank, a step or a node failed, in plain words: a cause class from the exit status,
the kernel's OOM evidence and the tail of what the process printed, and the few lines a user
needs to see (the Python exception, else the last lines of stderr). Pure and standard library
only: the launcher runs under ``python -S``, and the server builds its own causes (node lost,
preempted) with the same record shape."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from batchyard.node import proctree
from batchyard.node.pidns import forwarded

OOM = "oom"
TIMEOUT = "nccl/gloo timeout"
NODE_LOST = "node lost"
PREEMPTED = "preempted"
WALL_CLOCK = "wall clock"
USER = "user code error"
PREPARATION = "preparation failed"
IMAGE_PULL = "image pull failed"
HUNG = "hung"  # the server's verdict (server/services/hangs.py): no rank progressed
CAUSES = (OOM, TIMEOUT, NODE_LOST, PREEMPTED, WALL_CLOCK, "signal N", USER, PREPARATION,
          IMAGE_PULL)

MAX_LINES = 20
MAX_BYTES = 4096
MAX_LINE = 400
SUMMARY = 240
TAIL_READ = 64 * 1024

# torch prefixes every line of a rank's traceback with "[rankN]:"
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_OOM_TEXT = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|"
    r"^MemoryError\b|std::bad_alloc|Cannot allocate memory|Killed process \d+.*oom", re.M)
_TIMEOUT_TEXT = re.compile(
    r"Timed out waiting \d+ ?ms for (?:recv|send)|DistStoreError: .*Timed out|"
    r"Watchdog caught collective operation timeout|NCCL.*[Tt]ime ?out|"
    r"failed to pass monitoredBarrier|Socket Timeout|"
    r"torch\.distributed\.\w*(?:Timeout|TimeoutError)|Gloo.*[Tt]imed out")
_KILLED = re.compile(r"Killed process (\d+)|oom-kill:.*?\bpid=(\d+)")


def clean(lines: list[str]) -> list[str]:
    return [_RANK_PREFIX.sub("", line.rstrip("\r\n")) for line in lines]


def read_tail(path: Path, limit: int = TAIL_READ) -> list[str]:
    """The last lines of a log file, decoded leniently; [] when it is missing."""
    try:
        with open(path, "rb") as fh:
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


def _last_traceback(lines: list[str]) -> int | None:
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last)"):
            return i
    return None


def exception_line(lines: list[str]) -> str | None:
    """The exception a Python traceback ends with (its first line), if the text has one."""
    start = _last_traceback(lines)
    if start is None:
        return None
    for line in lines[start + 1:]:
        if line.strip() and not line[:1].isspace():
            return line.strip()
    return None


def error_lines(lines: list[str]) -> list[str]:
    """The last traceback when there is one, else the last non-blank lines: at most
    MAX_LINES lines and MAX_BYTES bytes, the end kept (the exception is there)."""
    start = _last_traceback(lines)
    picked = lines[start:] if start is not None else [line for line in lines if line.strip()]
    picked = [line if len(line) <= MAX_LINE else line[:MAX_LINE] + "…"
              for line in picked[-MAX_LINES:]]
    while picked and sum(len(line.encode()) + 1 for line in picked) > MAX_BYTES:
        picked.pop(0)
    return picked


def signal_of(code: int | None) -> int | None:
    """The signal a process died of: a negative code (Popen) or 128+N (the shell); -1 is
    the launcher's own "gone without an exit status"."""
    if code is None or code == -1:
        return None
    if code < 0:
        return -code
    if 128 < code < 128 + 65:
        return code - 128
    return None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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


def summary_of(cause: str, code: int | None, lines: list[str]) -> str:
    """One line: the exception, else how it ended, else the last line it printed."""
    found = exception_line(lines)
    if not found:
        number = signal_of(code)
        if number is not None:
            found = f"killed by {signal_name(number)}"
            if cause == OOM:
                found += " (out of memory)"
        elif lines:
            found = lines[-1].strip()
        elif code is not None:
            found = f"exited with code {code}"
        else:
            found = cause
    return found if len(found) <= SUMMARY else found[:SUMMARY] + "…"


def record(cause: str, *, node: str | None, node_rank: int | None = None,
           rank: int | None = None, exit_code: int | None = None,
           lines: list[str] | None = None, summary: str | None = None,
           what: str | None = None, at: float | None = None) -> dict[str, Any]:
    """The structured error every layer shows; ``at`` orders causes (the first wins)."""
    picked = error_lines(lines or [])
    return {"cause": cause, "rank": rank, "node": node, "node_rank": node_rank,
            "exit_code": exit_code, "what": what, "lines": picked,
            "summary": summary or summary_of(cause, exit_code, picked),
            "at": time.time() if at is None else at}


def rank_error(rank: int, code: int, node: str, node_rank: int, logs: list[Path],
               oom_killed: bool = False, at: float | None = None) -> dict[str, Any]:
    """A rank that exited non-zero: its stderr's tail (its stdout's when stderr is empty)."""
    lines: list[str] = []
    for path in logs:
        lines = read_tail(path)
        if any(line.strip() for line in lines):
            break
    cause = classify(code, lines, oom_killed)
    return record(cause, node=node, node_rank=node_rank, rank=rank, exit_code=code,
                  lines=lines, what="rank", at=at)


def message_of(error: dict[str, Any], head: str | None = None) -> str:
    """The job's one-line message: where (``head`` when the caller already says it, as
    "rank 3 on node n-1 exited with code 1"), the cause, and the summary."""
    cause, node = error.get("cause"), error.get("node")
    summary = str(error.get("summary") or "")
    if head is None:
        if error.get("rank") is not None:
            head = f"rank {error['rank']} on node {node} failed"
        elif error.get("what") not in (None, "rank", "node"):
            head = f"job {error['what']} on node {node} failed"
        elif node:
            head = f"node {node} failed"
        else:
            head = "the job failed"
    if not summary or summary == cause or summary.startswith("exited with code") \
            or summary in head:
        return f"{head} ({cause})"
    return f"{head} ({cause}): {summary}"


def first(errors: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The cause recorded first, by the time each node saw it."""
    found = [e for e in errors if isinstance(e, dict) and e.get("cause")]
    return min(found, key=lambda e: float(e.get("at") or 0.0)) if found else None


# --- OOM evidence ------------------------------------------------------------------------

def memory_cgroups(pid: int) -> list[Path]:
    """The memory cgroup directories of a process (v1 memory controller, v2 unified)."""
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
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
            out.append(Path("/sys/fs/cgroup/memory") / path)
        elif parts[0] == "0":
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
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
