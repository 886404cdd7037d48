"""GPU utilisation per job on a real server with real launchers, on a machine without GPUs:
the tests' fake nvidia-smi (tests/data/nvidia-smi, two H100s whose utilisation a JSON file
sets while the job runs) and, in a server of its own, a fake NVML (tests/data/fake-nvml, on
the launchers' PYTHONPATH). `job show` gives the mean and p10 per GPU, /metrics the job's
GPUs while it runs, and a job whose GPUs stay under the threshold for the window (a few
seconds here: the thresholds are the server's settings) gets the 'GPUs idle' event once."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(300)
DATA = Path(__file__).resolve().parents[1] / "data"
CLUSTER = "gpus"


def _gpus(path: Path, *utils: float) -> None:
    path.write_text(json.dumps([{"index": i, "utilization.gpu": u, "memory.used": 1000 + i,
                                 "memory.total": 81559} for i, u in enumerate(utils)]))


def _gpu_yard(home: Path, work: Path, extra: dict[str, str]) -> Yard:
    y = Yard(home, work)
    y.env["PATH"] = f"{DATA / 'nvidia-smi'}{os.pathsep}{y.env['PATH']}"
    y.env.update({"BATCHYARD_GPU_SAMPLE_SECONDS": "0.3", "BATCHYARD_GPU_IDLE_MINUTES": "0.05",
                  "BATCHYARD_GPU_IDLE_PERCENT": "10", **extra})
    y.start_server()
    y.ok("cluster", "create", "-n", CLUSTER, "-s", "Standard_NC12", "-t", "1")  # 2 GPUs
    y.wait_cluster(CLUSTER, 1)
    return y


@pytest.fixture(scope="module")
def smi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Yard, Path]]:
    state = tmp_path_factory.mktemp("gpus") / "gpus.json"
    _gpus(state, 2, 4)
    y = _gpu_yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"),
                  {"FAKE_NVIDIA_SMI_GPUS": str(state)})
    try:
        yield y, state
    finally:
        y.stop()


def _run(y: Yard, name: str, command: str, wait: bool = True) -> dict[str, Any]:
    path = y.write_job(name, {"name": name, "cluster": CLUSTER, "command": command})
    y.ok("job", "create", "-f", str(path))
    return y.wait_job(name, timeout=120) if wait else y.job(name)


def _idle_events(job: dict[str, Any]) -> list[str]:
    return [e["message"] for e in job["events"] if e["to"] == "gpus-idle"]


def test_idle_gpus_are_reported_once(smi: tuple[Yard, Path]) -> None:
    y, state = smi
    _gpus(state, 2, 4)
    job = _run(y, "idle", "sleep 7")
    assert job["state"] == "succeeded"
    by_gpu = {g["gpu"]: g for g in job["gpu_usage"]}
    assert set(by_gpu) == {0, 1}, job["gpu_usage"]
    assert (by_gpu[0]["mean"], by_gpu[0]["p10"]) == (2.0, 2)
    assert (by_gpu[1]["mean"], by_gpu[1]["p10"]) == (4.0, 4)
    assert by_gpu[0]["samples"] >= 5 and by_gpu[1]["memory_max_mb"] == 1001
    assert by_gpu[0]["node"] == f"{CLUSTER}-0"
    assert _idle_events(job) == ["GPUs idle: 3 % over 3 s"]
    shown = y.ok("job", "show", "idle").stdout
    assert "GPU utilisation" in shown and re.search(r"\b0\s+2 %\s+2 %", shown), shown
    assert "GPUs idle: 3 % over 3 s" in shown


def test_busy_gpus_raise_no_event_and_p10_sees_the_dip(smi: tuple[Yard, Path]) -> None:
    y, state = smi
    _gpus(state, 90, 80)
    _run(y, "busy", "sleep 6", wait=False)
    y.wait_job("busy", ("running",), timeout=60)
    time.sleep(2.5)
    _gpus(state, 5, 80)  # GPU 0 dips for a while: not all idle, so no event
    time.sleep(1.5)
    _gpus(state, 90, 80)
    job = y.wait_job("busy", timeout=60)
    by_gpu = {g["gpu"]: g for g in job["gpu_usage"]}
    assert by_gpu[0]["p10"] == 5 and 5 < by_gpu[0]["mean"] < 90
    assert by_gpu[1]["mean"] == 80.0
    assert _idle_events(job) == []


def test_metrics_show_a_running_jobs_gpus(smi: tuple[Yard, Path]) -> None:
    y, state = smi
    _gpus(state, 61, 7)
    _run(y, "watched", "sleep 30", wait=False)
    try:
        def sampled() -> str | None:
            text = httpx.get(y.url + "/metrics", timeout=10).text
            return text if 'batchyard_job_gpu_utilization_percent{' in text else None

        text = wait_until(sampled, 60, 0.3, "the job's GPU series in /metrics")
        assert re.search(r'batchyard_job_gpu_utilization_percent\{[^}]*job="watched"[^}]*\} '
                         r'34\.0', text), text  # the mean of its two GPUs
        assert re.search(r'batchyard_node_gpu_utilization_percent\{[^}]*node="gpus-0"[^}]*\} '
                         r'34\.0', text), text
        assert re.search(r'batchyard_node_gpu_memory_used_bytes\{[^}]*node="gpus-0"[^}]*\} '
                         r'2\.098200576e\+09', text), text  # 1000 + 1001 MiB
    finally:
        y.ok("job", "terminate", "watched")
    gone = httpx.get(y.url + "/metrics", timeout=10).text
    assert 'job="watched"' not in gone  # a job's series ends with it


def test_nvml_is_read_when_it_loads(tmp_path_factory: pytest.TempPathFactory) -> None:
    state = tmp_path_factory.mktemp("nvml") / "nvml.json"
    state.write_text(json.dumps([{"util": 33, "used": 2 << 30, "total": 80 << 30},
                                 {"util": 66, "used": 1 << 30, "total": 80 << 30}]))
    blank = tmp_path_factory.mktemp("smi") / "none.json"
    _gpus(blank, 99, 99)  # what nvidia-smi would say: NVML must come first
    y = _gpu_yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"),
                  {"PYTHONPATH": str(DATA / "fake-nvml"), "FAKE_NVML_GPUS": str(state),
                   "FAKE_NVIDIA_SMI_GPUS": str(blank)})
    try:
        job = _run(y, "nvml", "sleep 4")
        assert [(g["gpu"], g["mean"], g["memory_max_mb"]) for g in job["gpu_usage"]] == [
            (0, 33.0, 2048), (1, 66.0, 1024)]
    finally:
        y.stop()


def test_a_job_without_gpus_has_no_gpu_record(yard: Yard, cluster2: str) -> None:
    path = yard.write_job("cpu-only", {"name": "cpu-only", "cluster": cluster2,
                                       "command": "sleep 1"})
    yard.ok("job", "create", "-f", str(path))
    job = yard.wait_job("cpu-only", timeout=60)
    assert job["gpu_usage"] == [] and "GPU utilisation" not in yard.ok(
        "job", "show", "cpu-only").stdout
