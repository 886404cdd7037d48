"""Shared set-up for benchmarks: an isolated batchyard home with its own server."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def isolated_server() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="batchyard-bench-"))
    os.environ["BATCHYARD_HOME"] = str(home)
    os.environ.pop("BATCHYARD_SERVER", None)
    os.environ.pop("BATCHYARD_TOKEN", None)
    from batchyard.client import local_server

    local_server.start(port=0)
    try:
        yield home
    finally:
        local_server.stop()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "batchyard.cli.main", *args], text=True,
                          capture_output=True, check=True)


def median(values: list[float]) -> float:
    return statistics.median(values)


def load() -> str:
    """The 1/5/15-minute load averages: printed with every figure (the machine is shared)."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def spread(values: list[float], scale: float = 1000.0, unit: str = "ms") -> str:
    """min/median/max of ``values`` times ``scale``."""
    if not values:
        return "-"
    return (f"{min(values) * scale:.1f}/{statistics.median(values) * scale:.1f}/"
            f"{max(values) * scale:.1f} {unit}")


def wait_files(directory: Path, count: int, timeout: float = 60.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(directory.glob("rank-*.json"))
        if len(files) >= count:
            out = []
            for f in files:
                try:
                    out.append(json.loads(f.read_text()))
                except ValueError:
                    break
            else:
                return out
        time.sleep(0.005)
    raise TimeoutError(f"only {len(list(directory.glob('rank-*.json')))} of {count} ranks "
                       f"reported in {directory}")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
