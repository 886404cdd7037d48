"""The node half of the hang watchdog (node/watchdog.py): what counts as progress, timed on
a clock the test holds. Real files in a temporary stdouterr dir."""

from __future__ import annotations

import os
from pathlib import Path

from batchyard.node.watchdog import Watchdog, heartbeat_path


def test_idle_after_timeout_and_back_on_progress(tmp_path: Path) -> None:
    log = tmp_path / "n0-rank1.stdout.txt"
    log.write_text("start\n")
    dog = Watchdog(tmp_path, "n0", timeout=5.0, every=1.0)
    t = dog.last_progress
    assert dog.tick(t + 1) is None  # first look: the files it found are progress
    assert dog.tick(t + 5.5) is None  # 4.5 s since that look: not yet
    assert dog.tick(t + 6.5) is True and dog.idle
    assert dog.tick(t + 7.5) is None  # reported once
    with log.open("a") as fh:
        fh.write("step\n")
    assert dog.tick(t + 8.5) is False
    assert dog.idle_for(t + 9) == 0.5


def test_what_is_not_progress(tmp_path: Path) -> None:
    """The launcher's own log (it writes when it dumps), the preparation's, another node's
    ranks in a shared dir and files a job drops there do not count."""
    dog = Watchdog(tmp_path, "n0", timeout=2.0, every=0.5)
    t = dog.last_progress
    for name in ("n0-launcher.txt", "n0-prepare.stdout.txt", "n1-rank2.stdout.txt",
                 "notes.txt"):
        (tmp_path / name).write_text("x")
    assert dog.tick(t + 2.5) is True


def test_heartbeat_and_mpirun_count(tmp_path: Path) -> None:
    beat = heartbeat_path(tmp_path, "n0")
    assert beat.name == ".heartbeat-n0"
    dog = Watchdog(tmp_path, "n0", timeout=2.0, every=0.5)
    t = dog.last_progress
    assert dog.tick(t + 2.5) is True
    beat.touch()
    assert dog.tick(t + 3.0) is False
    assert dog.tick(t + 5.5) is True
    (tmp_path / "n0-mpirun.stderr.txt").write_text("x")
    assert dog.tick(t + 6.0) is False


def test_a_touch_in_the_same_second_is_seen(tmp_path: Path) -> None:
    """Change detection uses (size, mtime in ns): a touch that does not grow the file
    counts, whatever the clock of the file system says."""
    beat = heartbeat_path(tmp_path, "n0")
    beat.touch()
    dog = Watchdog(tmp_path, "n0", timeout=1.0, every=0.1)
    t = dog.last_progress
    dog.tick(t + 0.2)
    assert dog.tick(t + 1.3) is True
    os.utime(beat, ns=(1, 1))  # a clock far in the past: still a change
    assert dog.tick(t + 1.5) is False
