"""The failure record every layer shows (cause, rank, node, exit code, error lines, summary,
time), its cause names and the text rules that pick a Python exception out of a log tail.
Shared by the node (node/failure.py classifies a rank's end) and the server (server/failures.py
builds node lost, preempted, wall clock and hung, and picks the first cause): the server
learns about nodes only over the node channel, so this lives outside ``node/``. Standard
library only: the launcher imports it under ``python -S``."""

from __future__ import annotations

import re
import signal
import time
from typing import Any

OOM = "oom"
TIMEOUT = "nccl/gloo timeout"
NODE_LOST = "node lost"
PREEMPTED = "preempted"
WALL_CLOCK = "wall clock"
USER = "user code error"
PREPARATION = "preparation failed"
IMAGE_PULL = "image pull failed"
HUNG = "hung"  # the server's verdict (server/services/hangs.py): no rank progressed
PIDS_LIMIT = "process limit"  # limits.max_pids (the job's cgroup refused a fork)
OUTPUT_LIMIT = "output limit"  # limits.max_output
CAUSES = (OOM, TIMEOUT, NODE_LOST, PREEMPTED, WALL_CLOCK, "signal N", USER, PREPARATION,
          IMAGE_PULL, PIDS_LIMIT, OUTPUT_LIMIT)
MAX_LINES = 20
MAX_BYTES = 4096
MAX_LINE = 400
SUMMARY = 240
# torch prefixes every line of a rank's traceback with "[rankN]:"
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")


# What PyTorch, NCCL, gloo and Python print as a process exits, whatever ended it: never the
# error. (A failed rank that printed nothing else still prints these last.)
_EXIT_NOISE = re.compile(
    r"destroy_process_group\(\) was not called|"
    r"process group has NOT been destroyed before|"
    r"\bNCCL INFO\b|"
    r"resource_tracker: There appear to be \d+ leaked|"
    r"warnings\.warn\('resource_tracker|"
    r"torch\.distributed\.elastic\.multiprocessing\.api:Sending process \d+ closing signal")
# Open MPI's report of a signal that mpirun itself (the "HNP") caught while tearing the job
# down after a rank failed: the rank's failure is the error, this is its aftermath.
_SIGNAL_REPORT = re.compile(r"^\[[^\]]*\] \*\*\* Process received signal \*\*\*")
_SIGNAL_END = re.compile(r"\*\*\* End of error message \*\*\*")
_MPIRUN_FRAME = re.compile(r"\bmpirun\(|\borterun\(|mca_ess_hnp|\bprterun\(")


def clean(lines: list[str]) -> list[str]:
    return [_RANK_PREFIX.sub("", line.rstrip("\r\n")) for line in lines]


def signal_reports(lines: list[str], mpirun_only: bool = True) -> list[tuple[int, int]]:
    """(start, end) of each Open MPI signal report in ``lines``, end exclusive; only those
    mpirun itself printed (its own frames) unless ``mpirun_only`` is False (in mpirun's own
    log every report is mpirun's or its daemons': the ranks' stderr goes to their files)."""
    spans, start = [], None
    for i, line in enumerate(lines):
        if _SIGNAL_REPORT.match(line):
            start = i
        elif start is not None and _SIGNAL_END.search(line):
            if not mpirun_only or any(_MPIRUN_FRAME.search(x) for x in lines[start:i + 1]):
                spans.append((start, i + 1))
            start = None
    return spans


def mpirun_teardown(lines: list[str]) -> list[tuple[int, int]]:
    return signal_reports(lines)


def meaningful(lines: list[str], mpirun_log: bool = False) -> list[str]:
    """``lines`` without exit-time warnings and mpirun's own teardown reports (any report,
    for mpirun's own log); unchanged when that would leave nothing (then they are all there
    is to show)."""
    drop = {i for a, b in signal_reports(lines, not mpirun_log) for i in range(a, b)}
    kept = [line for i, line in enumerate(lines) if i not in drop and not _EXIT_NOISE.search(line)]
    return kept if any(line.strip() for line in kept) else lines


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
    MAX_LINES lines and MAX_BYTES bytes, the end kept (the exception is there). Exit-time
    warnings and mpirun's teardown reports are not error lines (``meaningful``)."""
    lines = meaningful(lines)
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


def summary_of(cause: str, code: int | None, lines: list[str]) -> str:
    """One line: the exception, else how it ended, else the last line it printed."""
    lines = meaningful(lines)
    found = exception_line(lines)
    if not found:
        number = signal_of(code)
        if number is not None:
            found = f"killed by {signal_name(number)}"
            if cause == OOM:
                found += " (out of memory)"
        elif [line for line in lines if line.strip()]:
            found = [line for line in lines if line.strip()][-1].strip()
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
