"""batchyard.heartbeat() and log_metric touch the hang watchdog's heartbeat file (at most
once a second), and do nothing where no watchdog listens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import batchyard
from batchyard.sdk import metrics


def test_heartbeat_touches_the_file_once_a_second(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    beat = tmp_path / ".heartbeat-n0"
    monkeypatch.setenv("BATCHYARD_HEARTBEAT_FILE", str(beat))
    monkeypatch.setattr(metrics, "_beat_at", -1e9)
    batchyard.heartbeat()
    assert beat.exists()
    os.utime(beat, ns=(1, 1))
    batchyard.heartbeat()  # within the second: no second touch
    assert beat.stat().st_mtime_ns == 1
    monkeypatch.setattr(metrics, "_beat_at", -1e9)
    batchyard.log_metric("loss", 0.5)  # a metric is progress too
    assert beat.stat().st_mtime_ns > 1


def test_heartbeat_outside_a_watched_job_does_nothing(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATCHYARD_HEARTBEAT_FILE", raising=False)
    monkeypatch.setattr(metrics, "_beat_at", -1e9)
    batchyard.heartbeat()
    monkeypatch.setenv("BATCHYARD_HEARTBEAT_FILE", str(tmp_path / "gone" / "beat"))
    batchyard.heartbeat()  # a directory that is not there: no error in the training loop
    assert not (tmp_path / "gone").exists()
