"""The preemption notice on a node (issue 36 §2): before the SIGTERM of a preemption, the
ranks get ``limits.checkpoint_signal``, a notice file (``$BATCHYARD_PREEMPT_NOTICE``, which
``batchyard.should_checkpoint()`` looks for) and ``limits.checkpoint_notice`` seconds to save.
A checkpoint reported after the notice (``batchyard.checkpoint_saved``, which writes
``$BATCHYARD_CHECKPOINT_MARK``) ends the wait at once: nothing more is to be saved.

Both files are dot names in the node's stdouterr dir: per node (several nodes may share the
dir), shipped nowhere, and writable by the ranks as the heartbeat file is. The ranks may write
that dir, so the launcher (root) touches both only through the dir's descriptor it holds from
before any job process ran, never through a link (``O_NOFOLLOW``, a fresh ``O_EXCL`` name
renamed into place), and reads the mark as a regular file of bounded size only."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from batchyard.node import proctree
from batchyard.node.pidns import FORWARDER
from batchyard.spec.checkpoint import signal_number

LOOK_EVERY = 0.1
MARK_MAX = 4096  # bytes: the SDK writes {"at": ..., "step": ...}
_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


def notice_name(node_name: str) -> str:
    return f".preempt-notice-{node_name}"


def mark_name(node_name: str) -> str:
    return f".checkpoint-{node_name}"


def notice_path(stdouterr: Path, node_name: str) -> Path:
    return stdouterr / notice_name(node_name)


def mark_path(stdouterr: Path, node_name: str) -> Path:
    return stdouterr / mark_name(node_name)


def last_mark(folder: int, node_name: str) -> dict[str, Any] | None:
    """The last checkpoint a rank of this node reported: {at, step}; None when none was or
    the file is not one the SDK wrote (a link, a FIFO, too big, half written)."""
    try:
        fd = os.open(mark_name(node_name), os.O_RDONLY | os.O_NONBLOCK | _FLAGS,
                     dir_fd=folder)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.read(fd, MARK_MAX + 1)[:MARK_MAX + 1] or b"null")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or not isinstance(data.get("at"), int | float) \
            or isinstance(data.get("at"), bool):
        return None
    step = data.get("step")
    return {"at": float(data["at"]),
            "step": step if isinstance(step, int) and not isinstance(step, bool) else None}


def prepare(folder: int, node_name: str) -> None:
    """A notice left by an earlier attempt in a shared dir must not warn this one; the mark
    file exists, writable by the ranks' uid, before they start."""
    for name in (notice_name(node_name), mark_name(node_name)):
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=folder)
    with contextlib.suppress(OSError):
        fd = os.open(mark_name(node_name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS,
                     0o666, dir_fd=folder)
        try:
            os.fchmod(fd, 0o666)
        finally:
            os.close(fd)


def _write_notice(folder: int, node_name: str, data: dict[str, Any]) -> None:
    name = notice_name(node_name)
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o644, dir_fd=folder)
    try:
        os.write(fd, json.dumps(data).encode())
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)


def listeners(pids: Iterable[int], number: int) -> list[int]:
    """The job's processes that catch the signal (SigCgt): a process that does not (a bash
    wrapper, a data loader worker, a job that checkpoints on SIGTERM) is not ended by a
    notice it never asked for; a rank sandbox's forwarder is no rank of its own."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as fh:
                if fh.read().startswith(FORWARDER):
                    continue
            with open(f"/proc/{pid}/status") as fh:
                caught = next((int(line.split()[1], 16) for line in fh
                               if line.startswith("SigCgt:")), 0)
        except (OSError, ValueError):
            continue
        if caught >> (number - 1) & 1:
            found.append(pid)
    return found


def give(folder: int, node_name: str, signal_name: str, tag: str,
         seconds: float, message: str, still_running: Callable[[], bool],
         say: Callable[[str], None]) -> dict[str, Any] | None:
    """Warn the ranks and wait: until the notice is over, a checkpoint is reported after
    it, or no rank runs any more. Answers the checkpoint reported in the notice, if any."""
    at = time.time()
    _write_notice(folder, node_name, {"at": at, "deadline": at + seconds, "message": message})
    number = signal_number(signal_name)
    told = listeners(proctree.tagged_pids(tag), number) if number is not None else []
    proctree.signal_all(told, number or 0)
    say(f"preemption notice: {signal_name} to {len(told)} process(es) that catch it, "
        f"{seconds:g}s to checkpoint before SIGTERM")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and still_running():
        saved = last_mark(folder, node_name)
        if saved is not None and saved["at"] >= at:
            say(f"checkpoint saved in the notice (step {saved['step']}): stopping now")
            return saved
        time.sleep(LOOK_EVERY)
    return None
