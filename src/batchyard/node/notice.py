"""The preemption notice on a node (issue 36 §2): before the SIGTERM of a preemption, the
ranks get ``limits.checkpoint_signal``, a notice file (``$BATCHYARD_PREEMPT_NOTICE``, which
``batchyard.should_checkpoint()`` looks for) and ``limits.checkpoint_notice`` seconds to save.
A checkpoint reported after the notice (``batchyard.checkpoint_saved``, which writes
``$BATCHYARD_CHECKPOINT_MARK``) ends the wait at once: nothing more is to be saved.

Both files are dot names in the node's stdouterr dir: per node (several nodes may share the
dir), shipped nowhere, and writable by the ranks as the heartbeat file is."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from batchyard.launchplan import read_json, write_json_atomic
from batchyard.node import proctree
from batchyard.node.pidns import FORWARDER
from batchyard.spec.checkpoint import signal_number

LOOK_EVERY = 0.1


def notice_path(stdouterr: Path, node_name: str) -> Path:
    return stdouterr / f".preempt-notice-{node_name}"


def mark_path(stdouterr: Path, node_name: str) -> Path:
    return stdouterr / f".checkpoint-{node_name}"


def last_mark(path: Path) -> dict[str, Any] | None:
    """The last checkpoint a rank of this node reported: {at, step}; None when none was or
    the file is not one the SDK wrote."""
    data = read_json(path) if path.exists() else None
    if not isinstance(data, dict) or not isinstance(data.get("at"), int | float):
        return None
    step = data.get("step")
    return {"at": float(data["at"]),
            "step": step if isinstance(step, int) and not isinstance(step, bool) else None}


def prepare(stdouterr: Path, node_name: str) -> None:
    """A notice left by an earlier attempt in a shared dir must not warn this one; the mark
    file exists, writable by the ranks' uid, before they start."""
    with contextlib.suppress(OSError):
        notice_path(stdouterr, node_name).unlink()
    mark = mark_path(stdouterr, node_name)
    with contextlib.suppress(OSError):
        mark.unlink()
    with contextlib.suppress(OSError):
        mark.touch()
        os.chmod(mark, 0o666)


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


def give(stdouterr: Path, node_name: str, signal_name: str, tag: str,
         seconds: float, message: str, still_running: Callable[[], bool],
         say: Callable[[str], None]) -> dict[str, Any] | None:
    """Warn the ranks and wait: until the notice is over, a checkpoint is reported after
    it, or no rank runs any more. Answers the checkpoint reported in the notice, if any."""
    at = time.time()
    write_json_atomic(notice_path(stdouterr, node_name),
                      {"at": at, "deadline": at + seconds, "message": message})
    number = signal_number(signal_name)
    told = listeners(proctree.tagged_pids(tag), number) if number is not None else []
    proctree.signal_all(told, number or 0)
    say(f"preemption notice: {signal_name} to {len(told)} process(es) that catch it, "
        f"{seconds:g}s to checkpoint before SIGTERM")
    deadline = time.monotonic() + seconds
    mark = mark_path(stdouterr, node_name)
    while time.monotonic() < deadline and still_running():
        saved = last_mark(mark)
        if saved is not None and saved["at"] >= at:
            say(f"checkpoint saved in the notice (step {saved['step']}): stopping now")
            return saved
        time.sleep(LOOK_EVERY)
    return None
