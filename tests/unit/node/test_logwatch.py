"""The log shipper's wake-ups (batchyard.node.logwatch): inotify on the real directory, a
pipe for other threads, and what counts as a change."""

from __future__ import annotations

import threading
from pathlib import Path

from batchyard.node.logwatch import DirWatch


def test_a_write_wakes_it_and_a_dot_file_does_not_count(tmp_path: Path) -> None:
    watch = DirWatch()
    try:
        assert watch.watch(str(tmp_path)) and watch.watching
        assert not watch.changed()
        (tmp_path / ".heartbeat").write_text("x")
        watch.wait(5.0)
        assert not watch.changed()
        (tmp_path / "n-rank0.stdout.txt").write_text("line\n")
        assert watch.wait(5.0) is False  # a change, not a wake-up
        assert watch.changed()
    finally:
        watch.close()


def test_wake_ends_a_wait_that_ignores_changes(tmp_path: Path) -> None:
    watch = DirWatch()
    try:
        watch.watch(str(tmp_path))
        (tmp_path / "n-rank0.stdout.txt").write_text("line\n")
        assert watch.wait(0.05, changes=False) is False  # the change stays queued
        threading.Timer(0.05, watch.wake).start()
        assert watch.wait(30.0, changes=False) is True
        assert watch.changed()
    finally:
        watch.close()
    watch.wake()  # after close: nothing to write to, no error


def test_the_directory_gone_drops_the_watch(tmp_path: Path) -> None:
    logs = tmp_path / "stdouterr"
    logs.mkdir()
    watch = DirWatch()
    try:
        watch.watch(str(logs))
        logs.rmdir()
        watch.wait(5.0)
        assert watch.changed() and not watch.watching
    finally:
        watch.close()


def test_a_link_in_place_of_the_directory_is_not_watched(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "stdouterr").symlink_to(real)
    watch = DirWatch()
    try:
        assert not watch.watch(str(tmp_path / "stdouterr"))
    finally:
        watch.close()
