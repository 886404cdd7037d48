"""GPU utilisation and memory, sampled every few seconds on a node (standard library only:
the launcher runs under ``python -S``). NVML through nvidia-ml-py (``pynvml``) when it loads
and initialises, else ``nvidia-smi --query-gpu``, else nothing. ``GpuTracker`` keeps what a
job's GPUs did over its whole run in constant space: a histogram of whole percents per GPU
(its mean and 10th percentile, exactly), the most memory used, a series for the portal's
chart whose buckets widen as the job runs, and whether every GPU has stayed under the idle
threshold for the idle window (the server turns that into the job's event)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

INTERVAL = 5.0
IDLE_PERCENT = 10.0
IDLE_SECONDS = 900.0
MAX_POINTS = 90
FIRST_STEP = 10.0
SMI_FIELDS = "index,utilization.gpu,memory.used,memory.total"


def _pynvml() -> ModuleType | None:
    """nvidia-ml-py's module: importable as usual, or (the launcher skips site-packages)
    from the site-packages of the environment it runs in."""
    with contextlib.suppress(ImportError):
        import pynvml

        return pynvml
    root = Path(sys.executable).parent.parent
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for folder in (root / "lib" / version / "site-packages",
                   Path(sys.base_prefix) / "lib" / version / "site-packages"):
        path = folder / "pynvml.py"
        if not path.is_file():
            continue
        spec = importlib.util.spec_from_file_location("pynvml", path)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception:  # a broken install: nvidia-smi instead
            return None
        sys.modules["pynvml"] = module
        return module
    return None


class Reader:
    """Reads every GPU of this machine: ``read()`` -> [{index, util_percent, mem_used_mb,
    mem_total_mb}]; ``source`` says how (nvml, nvidia-smi, or none)."""

    def __init__(self) -> None:
        self.source = "none"
        self._nvml: ModuleType | None = None
        nvml = _pynvml()
        if nvml is not None:
            try:
                nvml.nvmlInit()
                self._nvml, self.source = nvml, "nvml"
            except Exception:  # no driver here (nvidia-ml-py installed on a CPU machine)
                self._nvml = None
        if self._nvml is None and shutil.which("nvidia-smi"):
            self.source = "nvidia-smi"

    def read(self) -> list[dict[str, Any]]:
        if self._nvml is not None:
            try:
                return self._read_nvml(self._nvml)
            except Exception:
                return []
        if self.source == "nvidia-smi":
            return read_smi()
        return []

    @staticmethod
    def _read_nvml(nvml: ModuleType) -> list[dict[str, Any]]:
        found = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            found.append({"index": index, "util_percent": float(rates.gpu),
                          "mem_used_mb": int(memory.used) // (1024 * 1024),
                          "mem_total_mb": int(memory.total) // (1024 * 1024)})
        return found

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


def host_indices(ids: list[int | str] | None) -> list[int] | None:
    """The host indices (what the readers report) of the GPUs a job was given by index or
    by UUID (node/gpus.py: an agent given UUIDs passes them on); a MIG device counts as its
    GPU."""
    if ids is None or all(isinstance(i, int) for i in ids):
        return ids  # type: ignore[return-value]
    from batchyard.node.gpus import discover_gpus

    visible = ",".join(str(i) for i in ids)
    found = discover_gpus({**os.environ, "CUDA_VISIBLE_DEVICES": visible})
    return sorted({int(g["index"]) for g in found if g.get("index") is not None})


def read_smi() -> list[dict[str, Any]]:
    """Per-GPU utilisation and memory through ``nvidia-smi --query-gpu``; [] without it."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            found.append({"index": int(parts[0]), "util_percent": float(parts[1]),
                          "mem_used_mb": int(float(parts[2])),
                          "mem_total_mb": int(float(parts[3]))})
        except (ValueError, IndexError):
            continue  # "[N/A]" (a GPU that cannot say), or a line of something else
    return found


def settings(raw: dict[str, Any] | None) -> tuple[float, float, float]:
    """(interval, idle percent, idle seconds) from the plan's ``observe``."""
    raw = raw or {}

    def number(key: str, default: float, low: float) -> float:
        try:
            value = float(raw.get(key, default))
        except (TypeError, ValueError):
            return default
        return value if value >= low else default

    return (number("interval", INTERVAL, 0.2), number("idle_percent", IDLE_PERCENT, 0.0),
            number("idle_seconds", IDLE_SECONDS, 0.0))


class _Gpu:
    def __init__(self) -> None:
        self.hist = [0] * 101
        self.total = 0.0
        self.count = 0
        self.mem_max = 0
        self.mem_total = 0
        self.buckets: list[list[float]] = []  # [sum, count] per time bucket

    def add(self, util: float, used: int, total: int) -> None:
        self.hist[max(0, min(100, round(util)))] += 1
        self.total += util
        self.count += 1
        self.mem_max = max(self.mem_max, used)
        self.mem_total = total or self.mem_total

    def p10(self) -> int:
        need, seen = 0.1 * self.count, 0
        for percent, count in enumerate(self.hist):
            seen += count
            if count and seen >= need:
                return percent
        return 0

    def summary(self) -> dict[str, Any]:
        return {"mean": round(self.total / self.count, 1) if self.count else None,
                "p10": self.p10() if self.count else None, "samples": self.count,
                "mem_max_mb": self.mem_max, "mem_total_mb": self.mem_total}


class GpuTracker:
    """What the GPUs a job holds (host indices ``gpus``) did while it ran."""

    def __init__(self, gpus: list[int], idle_percent: float = IDLE_PERCENT,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self.gpus = {index: _Gpu() for index in gpus}
        self.idle_percent = idle_percent
        self.idle_seconds = idle_seconds
        self.t0: float | None = None
        self.step = FIRST_STEP
        self.idle_since: float | None = None
        self._idle_total = 0.0
        self._idle_count = 0
        self.last: float | None = None

    def add(self, ts: float, readings: list[dict[str, Any]]) -> None:
        mine = [r for r in readings if r.get("index") in self.gpus]
        if not mine:
            return
        if self.t0 is None:
            self.t0 = ts
        slot = int((ts - self.t0) / self.step)
        while slot >= MAX_POINTS:  # twice as wide buckets, half as many
            for gpu in self.gpus.values():
                pairs = gpu.buckets
                gpu.buckets = [[sum(b[0] for b in pairs[i:i + 2]),
                                sum(b[1] for b in pairs[i:i + 2])]
                               for i in range(0, len(pairs), 2)]
            self.step *= 2
            slot = int((ts - self.t0) / self.step)
        for reading in mine:
            gpu = self.gpus[int(reading["index"])]
            util = float(reading.get("util_percent") or 0.0)
            gpu.add(util, int(reading.get("mem_used_mb") or 0),
                    int(reading.get("mem_total_mb") or 0))
            while len(gpu.buckets) <= slot:
                gpu.buckets.append([0.0, 0])
            gpu.buckets[slot][0] += util
            gpu.buckets[slot][1] += 1
        self._watch_idle(ts, [float(r.get("util_percent") or 0.0) for r in mine])
        self.last = ts

    def _watch_idle(self, ts: float, utils: list[float]) -> None:
        if len(utils) < len(self.gpus) or max(utils) >= self.idle_percent:
            self.idle_since, self._idle_total, self._idle_count = None, 0.0, 0
            return
        if self.idle_since is None:
            self.idle_since = ts
        self._idle_total += sum(utils) / len(utils)
        self._idle_count += 1

    def idle(self) -> dict[str, Any] | None:
        """Every GPU under the threshold for the whole window: since when, and the mean."""
        if self.idle_since is None or self.last is None or \
                self.last - self.idle_since < self.idle_seconds or not self._idle_count:
            return None
        return {"since": self.idle_since, "mean": round(self._idle_total / self._idle_count, 1),
                "window": self.idle_seconds, "percent": self.idle_percent}

    def snapshot(self) -> dict[str, Any] | None:
        """The status block the launcher reports (``gpu``); None before any sample."""
        if self.t0 is None:
            return None
        return {"gpus": {str(i): g.summary() for i, g in self.gpus.items()},
                "series": {"t0": self.t0, "step": self.step,
                           "gpus": {str(i): [round(b[0] / b[1]) if b[1] else None
                                             for b in g.buckets]
                                    for i, g in self.gpus.items()}},
                "idle": self.idle()}
