"""Utilisation samples of a node while a job runs on it, for the portal: the host's CPU and
memory (/proc/stat, /proc/meminfo), the job's own processes (their sessions' CPU time and
resident memory from /proc/<pid>/stat), and GPUs (NVML or nvidia-smi: node/gpu_usage.py).
Standard library only; every reader tolerates a missing or odd /proc."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

INTERVAL = 2.0
FORWARDER = b"(by-fwd:"  # node/pidns.py's name for it (comm, in /proc/PID/stat)
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def host_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


def host_memory() -> tuple[int, int]:
    """(used, total) bytes: total minus what the kernel says is available."""
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    total = info.get("MemTotal", 0)
    return total - info.get("MemAvailable", info.get("MemFree", 0)), total


def session_usage(sessions: set[int]) -> tuple[int, int]:
    """(CPU jiffies, resident bytes) of every process in the given sessions (the launcher
    starts each rank in a session of its own)."""
    cpu = rss = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[3]) not in sessions or stat.startswith(FORWARDER, len(entry) + 1):
                continue  # (the sandbox's signal forwarder is no part of the job's use)
            cpu += int(fields[11]) + int(fields[12])
            rss += int(fields[21]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
    return cpu, rss


def gpus() -> list[dict[str, Any]]:
    """Per-GPU utilisation and memory through nvidia-smi; [] without it."""
    from batchyard.node.gpu_usage import read_smi

    return read_smi() if shutil.which("nvidia-smi") else []


def summary(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample in the few numbers /metrics shows of a node (server/telemetry/utilisation.py
    reads this small record, not the whole sample): CPU and memory, the mean utilisation of
    its GPUs and the memory in use on them."""
    out: dict[str, Any] = {"ts": sample.get("ts"), "cpu": sample.get("cpu_percent"),
                           "mem": sample.get("mem_percent")}
    gpus = [g for g in sample.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        out["gpu"] = round(sum(float(g.get("util_percent") or 0.0) for g in gpus) / len(gpus),
                           2)
        out["gpu_mem"] = sum(int(g.get("mem_used_mb") or 0) for g in gpus) * 1024 * 1024
        out["gpus"] = len(gpus)
    return out


class Sampler:
    """Samples every ``interval`` seconds and hands ``publish`` the status changes: the node's
    ``util`` sample, and (``gpus``: the GPUs the job holds) the job's ``gpu`` record
    (node/gpu_usage.py), its GPUs read every ``observe["interval"]`` seconds."""

    def __init__(self, sessions: Callable[[], set[int]],
                 publish: Callable[[dict[str, Any]], None], interval: float = INTERVAL,
                 gpus: list[int] | None = None,
                 observe: dict[str, Any] | None = None) -> None:
        from batchyard.node import gpu_usage

        self.sessions = sessions
        self.publish = publish
        self.interval = interval
        self.node_gpus = gpus
        self.gpu_interval, idle_percent, idle_seconds = gpu_usage.settings(observe)
        self.tracker = gpu_usage.GpuTracker(gpus, idle_percent, idle_seconds) if gpus \
            else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="usage-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _sessions(self) -> set[int]:
        try:
            return self.sessions()
        except RuntimeError:  # the launcher changed its ranks while we looked: next time
            return set()

    def _run(self) -> None:
        from batchyard.node.gpu_usage import Reader

        reader = Reader()
        busy0, total0 = host_cpu()
        job0, _ = session_usage(self._sessions())
        t0 = time.monotonic()
        readings: list[dict[str, Any]] = []
        read_at = -1e9
        wait = min(self.interval, self.gpu_interval) if self.tracker else self.interval
        while not self._stop.wait(wait):
            now = time.monotonic()
            if reader.source != "none" and now - read_at >= self.gpu_interval - 0.05:
                readings, read_at = reader.read(), now
                if self.tracker is not None:
                    self.tracker.add(time.time(), readings)
            if now - t0 < self.interval - 0.05:
                continue
            busy1, total1 = host_cpu()
            job1, rss = session_usage(self._sessions())
            t1 = time.monotonic()
            used, mem_total = host_memory()
            span = max(total1 - total0, 1)
            sample = {
                "ts": time.time(),
                "cpu_percent": round(100.0 * (busy1 - busy0) / span, 1),
                "job_cpu_cores": round(max(job1 - job0, 0) / TICKS / max(t1 - t0, 1e-3), 2),
                "job_rss_bytes": rss,
                "mem_used_bytes": used,
                "mem_total_bytes": mem_total,
                "mem_percent": round(100.0 * used / mem_total, 1) if mem_total else 0.0,
                "gpus": [r for r in readings
                         if self.node_gpus is None or r["index"] in self.node_gpus],
            }
            busy0, total0, job0, t0 = busy1, total1, job1, t1
            changes: dict[str, Any] = {"util": sample, "scrape": summary(sample)}
            if self.tracker is not None:
                changes["gpu"] = self.tracker.snapshot()
            try:
                self.publish(changes)
            except Exception:  # a failed sample must never disturb the job
                continue
        reader.close()
