"""The machine's utilisation, sampled every few seconds by the agent and sent with its
heartbeats (CPU, memory, each GPU through NVML or nvidia-smi), so /metrics shows a joined
machine's use whether or not a job runs there."""

from __future__ import annotations

import threading
import time
from typing import Any

from batchyard.node.usage import host_cpu, host_memory

INTERVAL = 5.0


class MachineUsage:
    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self.latest: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-usage", daemon=True)

    def start(self) -> MachineUsage:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        from batchyard.node.gpu_usage import Reader

        reader = Reader()
        busy0, total0 = host_cpu()
        while not self._stop.wait(self.interval):
            busy1, total1 = host_cpu()
            used, total = host_memory()
            self.latest = {"ts": time.time(),
                           "cpu_percent": round(100.0 * (busy1 - busy0) /
                                                max(total1 - total0, 1), 1),
                           "mem_used_bytes": used, "mem_total_bytes": total,
                           "mem_percent": round(100.0 * used / total, 1) if total else 0.0,
                           "gpus": reader.read()}
            busy0, total0 = busy1, total1
        reader.close()
