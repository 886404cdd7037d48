"""A node's periodic health check (cluster ``health_check_every``), run on idle and unusable
nodes by their agent, or by the server for the local backend's virtual nodes: the work dir's
free space (and that a file can be written there), the GPUs (``node/gpuhealth.py``: ECC,
XIDs, a small matmul) and, from an agent, the server's reachability. The node only measures;
the server decides what the result does to the node (``server/services/health.py``).
Standard library only, like the rest of the node side."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

MIN_FREE = 1 << 30  # bytes: a work dir with less free space than this fails ...
MIN_FREE_SHARE = 0.05  # ... or than this share of its file system, whichever is smaller
PROBE_BYTES = 4096
GPU_BUDGET = 60.0  # seconds for the GPU check (nvidia-smi, the kernel log, the matmul)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # (not reached)


def disk(work_dir: str) -> dict[str, Any]:
    """Free space under the threshold fails, as does a probe file that cannot be written:
    a full or read-only disk fails every job's set-up on that node."""
    try:
        usage = shutil.disk_usage(work_dir)
    except OSError as exc:
        return {"name": "disk", "ok": False, "message": f"work dir {work_dir}: {exc}"}
    floor = min(MIN_FREE, int(usage.total * MIN_FREE_SHARE))
    figures = {"free_bytes": usage.free, "total_bytes": usage.total, "min_free_bytes": floor}
    if usage.free < floor:
        return {"name": "disk", "ok": False, **figures, "message": (
            f"work dir {work_dir} has {_size(usage.free)} free of {_size(usage.total)} "
            f"(under {_size(floor)})")}
    probe = Path(work_dir) / f".health-probe-{secrets.token_hex(8)}"
    try:  # a fresh name, never through a link
        with os.fdopen(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                               | os.O_CLOEXEC, 0o600), "wb") as fh:
            fh.write(b"\0" * PROBE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return {"name": "disk", "ok": False, **figures,
                "message": f"work dir {work_dir}: cannot write a file: {exc.strerror or exc}"}
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return {"name": "disk", "ok": True, **figures,
            "message": f"work dir {_size(usage.free)} free of {_size(usage.total)}"}


def gpus(gpu_ids: list[int | str], python: str | None) -> dict[str, Any]:
    from batchyard.node.gpuhealth import check_gpus

    found = check_gpus(gpu_ids, python, time.time() + GPU_BUDGET)
    return {"name": "gpu", "ok": bool(found.get("ok")), "message": str(found.get("message"))}


def server(url: str, ca_file: str | None, timeout: float = 5.0) -> dict[str, Any]:
    from batchyard import tlstrust

    start = time.perf_counter()
    try:
        status, _ = tlstrust.urlopen_json("GET", f"{url.rstrip('/')}/api/v1/health", None,
                                          None, ca_file, timeout)
    except OSError as exc:
        return {"name": "server", "ok": False,
                "message": f"server {url} unreachable: {getattr(exc, 'reason', exc)}"}
    took = round((time.perf_counter() - start) * 1e3, 1)
    if status >= 500:
        return {"name": "server", "ok": False, "ms": took,
                "message": f"server {url} answered HTTP {status}"}
    return {"name": "server", "ok": True, "ms": took, "message": f"server answered in {took:g} ms"}


def run(work_dir: str, gpu_ids: list[int | str] | None = None, python: str | None = None,
        server_url: str | None = None, ca_file: str | None = None) -> dict[str, Any]:
    """Every check's figures, ``ok`` and ``reason`` (the failed checks' messages)."""
    started = time.time()
    checks = [disk(work_dir)]
    if gpu_ids:
        checks.append(gpus(list(gpu_ids), python))
    if server_url:
        checks.append(server(server_url, ca_file))
    failed = [c["message"] for c in checks if not c["ok"]]
    return {"at": started, "took_s": round(time.time() - started, 3), "ok": not failed,
            "reason": "; ".join(failed) or None, "checks": checks}
