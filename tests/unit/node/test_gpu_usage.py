"""GPU sampling on a node (node/gpu_usage.py): the per-job record's mean and 10th percentile
are exact at any length of job, its chart series stays bounded, the idle spell needs every
GPU under the threshold for the whole window; the readers read the tests' fake nvidia-smi
(tests/data/nvidia-smi) and a fake NVML module, and fall back from NVML to nvidia-smi."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from batchyard.node import gpu_usage
from batchyard.node.gpu_usage import MAX_POINTS, GpuTracker, Reader

FAKES = Path(__file__).resolve().parents[2] / "data"
SMI = FAKES / "nvidia-smi"
NVML = FAKES / "fake-nvml"


def reading(index: int, util: float, used: int = 100, total: int = 1000) -> dict[str, object]:
    return {"index": index, "util_percent": util, "mem_used_mb": used, "mem_total_mb": total}


def test_mean_and_p10_are_exact() -> None:
    tracker = GpuTracker([0], idle_seconds=1e9)
    values = [float(v) for v in range(1, 101)]  # 1..100 %
    for second, value in enumerate(values):
        tracker.add(1000.0 + second, [reading(0, value, used=10 * second)])
    summary = tracker.snapshot()["gpus"]["0"]
    assert summary["mean"] == 50.5
    assert summary["p10"] == 10  # the 10th of 100 ordered values
    assert summary["samples"] == 100 and summary["mem_max_mb"] == 990
    assert summary["mem_total_mb"] == 1000


def test_only_the_jobs_gpus_are_tracked() -> None:
    tracker = GpuTracker([1])
    tracker.add(1.0, [reading(0, 90), reading(1, 20)])
    assert set(tracker.snapshot()["gpus"]) == {"1"}
    assert tracker.snapshot()["gpus"]["1"]["mean"] == 20
    assert GpuTracker([3]).snapshot() is None  # nothing sampled of its GPU yet


def test_series_stays_bounded_as_the_job_runs() -> None:
    tracker = GpuTracker([0, 1])
    for second in range(0, 20 * 3600, 5):  # 20 hours, a sample every 5 s
        tracker.add(float(second), [reading(0, 50.0), reading(1, 10.0)])
    series = tracker.snapshot()["series"]
    assert all(len(points) <= MAX_POINTS for points in series["gpus"].values())
    assert series["step"] * MAX_POINTS >= 20 * 3600  # the whole run, in wider buckets
    assert set(series["gpus"]["0"]) == {50} and set(series["gpus"]["1"]) == {10}


def test_idle_needs_every_gpu_under_the_threshold_for_the_window() -> None:
    tracker = GpuTracker([0, 1], idle_percent=10.0, idle_seconds=60.0)
    for second in range(0, 50, 5):
        tracker.add(float(second), [reading(0, 3.0), reading(1, 5.0)])
    assert tracker.idle() is None  # 45 s of 60
    tracker.add(55.0, [reading(0, 3.0), reading(1, 50.0)])  # one GPU works: the spell ends
    for second in range(60, 125, 5):
        tracker.add(float(second), [reading(0, 3.0), reading(1, 3.0)])
    idle = tracker.idle()
    assert idle is not None and idle["since"] == 60.0 and idle["mean"] == 3.0
    assert idle["window"] == 60.0 and tracker.snapshot()["idle"] == idle
    tracker.add(130.0, [reading(0, 40.0), reading(1, 3.0)])
    assert tracker.idle() is None


def test_a_missing_gpu_is_not_idle() -> None:
    tracker = GpuTracker([0, 1], idle_seconds=0.0)
    tracker.add(1.0, [reading(0, 0.0)])
    tracker.add(2.0, [reading(0, 0.0)])
    assert tracker.idle() is None


def test_settings_fall_back_on_bad_values() -> None:
    assert gpu_usage.settings(None) == (gpu_usage.INTERVAL, gpu_usage.IDLE_PERCENT,
                                        gpu_usage.IDLE_SECONDS)
    assert gpu_usage.settings({"interval": "x", "idle_percent": -1, "idle_seconds": 30}) == (
        gpu_usage.INTERVAL, gpu_usage.IDLE_PERCENT, 30.0)


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_usage, "_pynvml", lambda: None)


def test_fake_nvidia_smi_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 no_nvml: None) -> None:
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps([
        {"index": 0, "utilization.gpu": 37, "memory.used": 1200, "memory.total": 81559},
        {"index": 1, "utilization.gpu": "[N/A]", "memory.used": 0, "memory.total": 81559}]))
    monkeypatch.setenv("PATH", f"{SMI}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", str(state))
    reader = Reader()
    assert reader.source == "nvidia-smi"
    assert reader.read() == [{"index": 0, "util_percent": 37.0, "mem_used_mb": 1200,
                              "mem_total_mb": 81559}]  # the GPU that cannot say is left out


def test_no_gpu_tool_reads_nothing(monkeypatch: pytest.MonkeyPatch, no_nvml: None,
                                   tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    reader = Reader()
    assert reader.source == "none" and reader.read() == []


def test_fake_nvml_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps([{"util": 64, "used": 3 << 30, "total": 80 << 30},
                                 {"util": 2, "used": 0, "total": 80 << 30}]))
    monkeypatch.setenv("FAKE_NVML_GPUS", str(state))
    monkeypatch.setenv("PATH", f"{SMI}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.syspath_prepend(str(NVML))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    reader = Reader()
    try:
        assert reader.source == "nvml"
        assert reader.read() == [
            {"index": 0, "util_percent": 64.0, "mem_used_mb": 3072, "mem_total_mb": 81920},
            {"index": 1, "util_percent": 2.0, "mem_used_mb": 0, "mem_total_mb": 81920}]
    finally:
        reader.close()
        sys.modules.pop("pynvml", None)


def test_nvml_without_a_driver_falls_back_to_nvidia_smi(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_GPUS", str(tmp_path / "missing.json"))  # init fails
    monkeypatch.setenv("PATH", f"{SMI}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FAKE_NVIDIA_SMI_GPUS", raising=False)
    monkeypatch.syspath_prepend(str(NVML))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    try:
        reader = Reader()
        assert reader.source == "nvidia-smi"
        assert [g["index"] for g in reader.read()] == [0, 1]
    finally:
        sys.modules.pop("pynvml", None)
