"""A fake NVML (nvidia-ml-py's ``pynvml``) for the tests: the GPUs of $FAKE_NVML_GPUS, a JSON
file ``[{"util": 37, "used": BYTES, "total": BYTES}, ...]`` read at every call (so a test
changes them while a job runs). Without that file nvmlInit fails as it does on a machine
without the NVIDIA driver."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


def _gpus() -> list[dict[str, Any]]:
    path = os.environ.get("FAKE_NVML_GPUS")
    try:
        with open(path or "") as fh:
            return list(json.load(fh))
    except (OSError, ValueError) as exc:
        raise NVMLError(f"NVML Shared Library Not Found ({exc})") from None


def nvmlInit() -> None:
    _gpus()


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < len(_gpus()):
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    gpu = _gpus()[handle]
    return SimpleNamespace(gpu=int(gpu.get("util", 0)), memory=int(gpu.get("mem_util", 0)))


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    gpu = _gpus()[handle]
    total = int(gpu.get("total", 80 << 30))
    used = int(gpu.get("used", 0))
    return SimpleNamespace(total=total, used=used, free=total - used)
