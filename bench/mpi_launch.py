"""Time from submit to all MPI ranks running: batchyard's mpi distribution (mpirun on node 0
over 2 virtual nodes through the batchyard rsh agent) vs bare ``mpirun -np 4`` on this
machine, in one run. Each rank records when its Python code started.

    python bench/mpi_launch.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import isolated_server, median, wait_files

PROBE = ("import json, os, time; t = time.time(); "
         "r = os.environ.get('OMPI_COMM_WORLD_RANK', '0'); "
         "d = os.environ['RDV']; p = os.path.join(d, f'rank-{r}.json'); "
         "open(p + '.tmp', 'w').write(json.dumps({'started_at': t})); os.replace(p + '.tmp', p)")


def bare(rdv: Path) -> float:
    argv = ["mpirun", "--oversubscribe", "-np", "4", "--bind-to", "none"]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    t0 = time.time()
    proc = subprocess.Popen([*argv, "-x", "RDV", sys.executable, "-c", PROBE],
                            env=dict(os.environ, RDV=str(rdv)), stdout=subprocess.DEVNULL)
    ranks = wait_files(rdv, 4)
    proc.wait()
    return max(float(r["started_at"]) for r in ranks) - t0  # type: ignore[arg-type]


def through_batchyard(client: object, rdv: Path, i: int) -> float:
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    spec = {"nodes": 2, "distribution": {"type": "mpi", "processes_per_node": 2},
            "command": ["python", "-c", PROBE], "env": {"RDV": str(rdv)}}
    t0 = time.time()
    client.post("/workspaces/default/jobs", {"spec": spec, "cluster": "local2",
                                             "name": f"mpi-{i}"})
    ranks = wait_files(rdv, 4)
    path = client.job_path("default", "default", f"mpi-{i}")
    while client.get(path)["state"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.05)
    return max(float(r["started_at"]) for r in ranks) - t0  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    bare_t, ours = [], []
    with isolated_server():
        from batchyard.client.http import Client

        client = Client.connect(quiet=True)
        client.post("/workspaces/default/clusters", {"name": "local2",
                                                     "vm_size": "Standard_D2_v2",
                                                     "manual": {"target_node_count": 2}})
        for i in range(args.runs):
            for kind in ("bare", "batchyard"):
                rdv = Path(tempfile.mkdtemp(prefix=f"mpi-{kind}-"))
                if kind == "bare":
                    bare_t.append(bare(rdv))
                else:
                    ours.append(through_batchyard(client, rdv, i))
                shutil.rmtree(rdv, ignore_errors=True)
        client.close()
    mb, mo = median(bare_t), median(ours)
    print(f"submit -> all 4 MPI ranks running (2 nodes x 2), median of {args.runs}:")
    print(f"  bare mpirun -np 4       : {mb * 1000:8.1f} ms")
    print(f"  batchyard mpi job       : {mo * 1000:8.1f} ms")
    print(f"  overhead                : {(mo - mb) * 1000:8.1f} ms   ratio {mo / mb:.2f}x")
    print(json.dumps({"mpirun_median_s": round(mb, 4), "batchyard_median_s": round(mo, 4),
                      "overhead_ms": round((mo - mb) * 1000, 1)}))


if __name__ == "__main__":
    main()
