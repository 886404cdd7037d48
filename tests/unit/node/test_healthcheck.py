"""The node side of the periodic health check (node/healthcheck.py) on this machine's own
file systems: a writable work dir with room passes with its figures; a missing one and one
where no file can be written fail, naming the work dir."""

from __future__ import annotations

from pathlib import Path

from batchyard.node import healthcheck


def test_a_work_dir_with_room_passes_with_its_figures(tmp_path: Path) -> None:
    found = healthcheck.run(str(tmp_path))
    assert found["ok"] and found["reason"] is None, found
    disk = found["checks"][0]
    assert disk["name"] == "disk" and disk["free_bytes"] > disk["min_free_bytes"] > 0, disk
    assert disk["min_free_bytes"] <= healthcheck.MIN_FREE
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_a_missing_work_dir_fails_naming_it(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    found = healthcheck.run(str(gone))
    assert not found["ok"] and found["reason"].startswith(f"work dir {gone}: "), found


def test_a_work_dir_where_no_file_can_be_written_fails(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    found = healthcheck.run(str(not_a_dir))
    assert not found["ok"], found
    assert found["reason"].startswith(f"work dir {not_a_dir}: cannot write a file: "), found
