"""Submit-to-all-ranks-running for the 2x2 hello job through batchyard, against spawning the
same 4 processes directly, in one run.

Each rank of examples/hello-distributed records the time its user code started
(``--rendezvous``). batchyard's figure is measured from just before the job-create HTTP call
to the last rank's start; the bare figure from just before ``Popen`` of the 4 processes to the
last rank's start. Both include Python's start-up of the ranks, so the difference is
batchyard's overhead: API, scheduling, launchers, env contract.

    python bench/launch.py [--runs 15]
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
from _harness import ROOT, isolated_server, median, wait_files

HELLO = ROOT / "examples" / "hello-distributed"


def bare(rendezvous: Path) -> float:
    t0 = time.time()
    procs = []
    for rank in range(4):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank % 2),
                   LOCAL_WORLD_SIZE="2", NODE_RANK=str(rank // 2), GROUP_RANK=str(rank // 2),
                   BATCHYARD_NODE_RANK=str(rank // 2), BATCHYARD_NUM_NODES="2",
                   BATCHYARD_NODE_IPS="127.0.0.1\n127.0.0.1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT="29500", AZ_BATCH_MASTER_NODE="127.0.0.1:29500",
                   AZ_BATCHAI_TASK_INDEX=str(rank // 2), PYTHONUNBUFFERED="1")
        procs.append(subprocess.Popen([sys.executable, "hello.py", "--rendezvous",
                                       str(rendezvous)], cwd=HELLO, env=env,
                                      stdout=subprocess.DEVNULL))
    ranks = wait_files(rendezvous, 4)
    for p in procs:
        p.wait()
    return max(float(r["started_at"]) for r in ranks) - t0  # type: ignore[arg-type]


def through_batchyard(client: object, rendezvous: Path, i: int) -> float:
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    spec = {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
            "command": ["python", str(HELLO / "hello.py"), "--rendezvous", str(rendezvous)]}
    t0 = time.time()
    client.post("/workspaces/default/jobs", {"spec": spec, "cluster": "local2",
                                             "name": f"bench-{i}"})
    ranks = wait_files(rendezvous, 4)
    start = max(float(r["started_at"]) for r in ranks)  # type: ignore[arg-type]
    path = client.job_path("default", "default", f"bench-{i}")
    while client.get(path)["state"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.05)
    return start - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with isolated_server():
        from batchyard.client.http import Client

        client = Client.connect(quiet=True)
        client.post("/workspaces/default/clusters", {"name": "local2",
                                                     "vm_size": "Standard_D2_v2",
                                                     "manual": {"target_node_count": 2}})
        b_times, d_times = [], []
        for i in range(args.runs):
            for kind in ("bare", "batchyard"):
                rdv = Path(tempfile.mkdtemp(prefix=f"rdv-{kind}-"))
                if kind == "bare":
                    b_times.append(bare(rdv))
                else:
                    d_times.append(through_batchyard(client, rdv, i))
                shutil.rmtree(rdv, ignore_errors=True)
        client.close()
    mb, md = median(b_times), median(d_times)
    result = {"runs": args.runs, "bare_spawn_median_s": round(mb, 4),
              "batchyard_median_s": round(md, 4), "overhead_ms": round((md - mb) * 1000, 1),
              "ratio": round(md / mb, 2), "target_overhead_ms": 300}
    print(f"submit -> all 4 ranks running (2 nodes x 2), median of {args.runs}:")
    print(f"  bare spawn of 4 processes : {mb * 1000:8.1f} ms")
    print(f"  batchyard job create      : {md * 1000:8.1f} ms")
    print(f"  overhead                  : {(md - mb) * 1000:8.1f} ms  (target < 300 ms)")
    print(f"  ratio                     : {md / mb:8.2f}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
