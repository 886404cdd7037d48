"""kill_everything against real processes that keep forking while they are killed."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from batchyard.node import proctree

# a tagged shell that forks a tagged child as fast as it can: every scan of /proc is out of
# date by the time its SIGKILLs go out
FORKER = "trap '' TERM; while :; do sleep 60 & done"


def _tagged(tag: str) -> list[int]:
    return [p for p in proctree.tagged_pids(tag) if proctree.alive(p)]


def test_a_process_forking_while_it_is_killed_leaves_no_child() -> None:
    for _ in range(3):
        tag = f"{uuid.uuid4()}/0"
        env = {**os.environ, "BATCHYARD_PROC_TAG": tag}
        shell = subprocess.Popen(["bash", "-c", FORKER], env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 10
            while len(_tagged(tag)) < 20 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(_tagged(tag)) >= 20, "the forker did not start"
            proctree.kill_everything(tag, grace=0.0, own_children=False)
            shell.wait(timeout=5)
            assert _tagged(tag) == []
        finally:
            proctree.signal_all(proctree.tagged_pids(tag), 9)
            if shell.poll() is None:
                shell.kill()
                shell.wait()
