"""Utilisation samples of a node while a job runs on it, for the portal: the host's CPU and
memory (/proc/stat, /proc/meminfo), the job's own processes (their sessions' CPU time and
resident memory from /proc/<pid>/stat), and GPUs through nvidia-smi when it is installed.
Standard library only; every reader tolerates a missing or odd /proc."""

from __future__ import annotations

import os
import shutil
import subprocess
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
    """Per-GPU utilisation and memory through nvidia-smi (NVML); [] without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=3,
            check=False).stdout
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
            continue
    return found


class Sampler:
    """Samples every ``interval`` seconds and hands each sample to ``publish``."""

    def __init__(self, sessions: Callable[[], set[int]],
                 publish: Callable[[dict[str, Any]], None], interval: float = INTERVAL) -> None:
        self.sessions = sessions
        self.publish = publish
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="usage-sampler", daemon=True)
        self._gpus = shutil.which("nvidia-smi") is not None

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
        busy0, total0 = host_cpu()
        job0, _ = session_usage(self._sessions())
        t0 = time.monotonic()
        while not self._stop.wait(self.interval):
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
                "gpus": gpus() if self._gpus else [],
            }
            busy0, total0, job0, t0 = busy1, total1, job1, t1
            try:
                self.publish(sample)
            except Exception:  # a failed sample must never disturb the job
                continue
