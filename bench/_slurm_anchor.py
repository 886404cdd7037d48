"""`sbatch` as the anchor of the submit benchmarks (bench/api_load.py --slurm,
bench/cli_startup.py --slurm): a real Slurm started here (tests/slurmkit.py: slurmctld on a
``login`` host, one slurmd; root only), and ``total`` submits from ``parallel`` concurrent
`sbatch` processes, as a user's `xargs -P` loop does.

Every job is submitted held (``--hold``): it stays pending, as the batchyard side's jobs stay
queued, so both sides measure the submit path and nothing runs. The client commands must run
inside the login host (its network namespace), so the timing loop runs there (DRIVER)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r'''
import json, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
parallel, total = int(sys.argv[1]), int(sys.argv[2])
argv = ["sbatch", "--hold", "--parsable", "--wrap", "true", "-o", "/dev/null", "-J", "anchor"]

def one(_):
    t0 = time.perf_counter()
    rc = subprocess.run(argv, capture_output=True).returncode
    return time.perf_counter() - t0, rc

t0 = time.perf_counter()
with ThreadPoolExecutor(parallel) as pool:
    got = list(pool.map(one, range(total)))
took = time.perf_counter() - t0
subprocess.run(["scancel", "--name", "anchor"], capture_output=True)
print(json.dumps({"seconds": took, "latencies": [g[0] for g in got],
                  "errors": sum(1 for g in got if g[1] != 0)}))
'''


class SlurmAnchor:
    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def submits(self, parallel: int, total: int) -> dict[str, Any]:
        """``total`` held sbatch submits from ``parallel`` at once: rate, latencies."""
        proc = self.cluster.run([sys.executable, "-c", DRIVER, str(parallel), str(total)],
                                timeout=120 + total)
        if proc.returncode != 0:
            raise RuntimeError(f"the sbatch driver failed: {proc.stderr[-2000:]}")
        out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        out["rate"] = (total - out["errors"]) / out["seconds"]
        return out


@contextlib.contextmanager
def slurm() -> Iterator[SlurmAnchor]:
    sys.path.insert(0, str(ROOT / "tests"))
    from slurmkit import NodeSpec, SlurmCluster

    with SlurmCluster((NodeSpec("sn1"),), partitions={"debug": ("sn1",)}).start() as sc:
        yield SlurmAnchor(sc)
