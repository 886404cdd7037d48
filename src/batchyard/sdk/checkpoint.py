"""Preemption from inside a job (issue 36 §2). Before a preemption's SIGTERM the ranks get a
notice: ``limits.checkpoint_signal`` (SIGUSR1 by default), and ``should_checkpoint()`` turns
True. A rank that has saved calls ``checkpoint_saved(step)``: the job is then stopped at once
rather than at the notice's end, preemptions choose victims by the work done since, and
``job show`` names it. Both are cheap file operations on the node (no server call), and do
nothing outside a job."""

from __future__ import annotations

import json
import os
import time


def should_checkpoint() -> bool:
    """True once this node's ranks have been told that a preemption is coming."""
    path = os.environ.get("BATCHYARD_PREEMPT_NOTICE")
    return path is not None and path != "" and os.path.exists(path)


def checkpoint_saved(step: int | None = None) -> None:
    """Report that a checkpoint (of ``step``) is complete: call it after the files are
    written and closed. The node's launcher passes it on to the server."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"step must be an int, not {type(step).__name__}")
    path = os.environ.get("BATCHYARD_CHECKPOINT_MARK")
    if not path:
        return
    data = json.dumps({"at": time.time(), "step": step}).encode()
    # written in place with one write (the ranks may not create files in its dir); the
    # launcher reads a half-written file as no report and looks again
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
