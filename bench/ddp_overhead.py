"""Training throughput of examples/mnist-ddp through batchyard vs bare torchrun, in one run.

Both run 2 nodes x 2 processes on this machine: torchrun as two static-rendezvous agents
(--nnodes 2 --node-rank 0/1), batchyard as a job on a 2-node local cluster. The script prints
``samples/s`` measured inside the training loop (start-up excluded), so the ratio shows what
batchyard costs while a job trains. The runs alternate in pairs whose order flips each time
(torchrun first, then batchyard first, ...), so neither side always runs on a machine the
other has just warmed or loaded; each pair's ratio is printed too, with the load average.
Target (issue 37): ratio >= 0.99.

    python bench/ddp_overhead.py [--runs 3] [--epochs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import ROOT, free_port, isolated_server, load, median

DDP = ROOT / "examples" / "mnist-ddp"
RATE = re.compile(rb"samples/s: ([0-9.]+)")


def torchrun(epochs: int) -> float:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                          "--nproc-per-node", "2", "--node-rank", str(node),
                          "--master-addr", "127.0.0.1", "--master-port", str(port),
                          "train.py", "--epochs", str(epochs)],
                         cwd=DDP, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for node in (0, 1)
    ]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("torchrun failed:\n" + outs[0].decode(errors="replace")[-3000:])
    return float(RATE.findall(outs[0])[-1])


def through_batchyard(client: object, epochs: int, i: int) -> float:
    from batchyard.client.http import Client
    from batchyard.snapshot import pack

    assert isinstance(client, Client)
    sha = client.upload_snapshot(pack(DDP))
    spec = {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
            "code": f"snapshot:{sha}", "command": f"python train.py --epochs {epochs}",
            "outputs": {"MODEL": {}}}
    name = f"ddp-{i}"
    client.post("/workspaces/default/jobs", {"spec": spec, "cluster": "local2", "name": name})
    path = client.job_path("default", "default", name)
    while (job := client.get(path))["state"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.2)
    if job["state"] != "succeeded":
        raise RuntimeError(f"batchyard job {name} {job['state']}: {job.get('message')}")
    log = b"".join(client.stream(path + "/logs", rank=0, stream="stdout"))
    return float(RATE.findall(log)[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6, help="alternated pairs")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    bare, ours = [], []
    with isolated_server():
        from batchyard.client.http import Client

        client = Client.connect(quiet=True)
        client.post("/workspaces/default/clusters", {"name": "local2",
                                                     "vm_size": "Standard_D2_v2",
                                                     "manual": {"target_node_count": 2}})
        loads = []
        for i in range(args.runs):  # pairs, the order flipping each time
            first_bare = i % 2 == 0
            for side in ("bare", "ours") if first_bare else ("ours", "bare"):
                if side == "bare":
                    bare.append(torchrun(args.epochs))
                else:
                    ours.append(through_batchyard(client, args.epochs, i))
            loads.append(load())
            print(f"  pair {i + 1} ({'torchrun' if first_bare else 'batchyard'} first): "
                  f"torchrun {bare[-1]:.0f}, batchyard {ours[-1]:.0f} samples/s, ratio "
                  f"{ours[-1] / bare[-1]:.3f}, load {loads[-1]}", flush=True)
        client.close()
    mb, mo = median(bare), median(ours)
    pairs = [o / b for o, b in zip(ours, bare, strict=True)]
    print(f"mnist-ddp, 2 nodes x 2 processes, {args.epochs} epochs, {args.runs} alternated "
          "pairs; samples/s min/median/max:")
    print(f"  bare torchrun : {min(bare):8.0f} {mb:8.0f} {max(bare):8.0f}")
    print(f"  batchyard     : {min(ours):8.0f} {mo:8.0f} {max(ours):8.0f}")
    print(f"  ratio of medians {mo / mb:.3f}; per pair min/median/max {min(pairs):.3f} "
          f"{median(pairs):.3f} {max(pairs):.3f}   (target >= 0.99); load {loads}")
    print(json.dumps({"torchrun_samples_s": [min(bare), mb, max(bare)],
                      "batchyard_samples_s": [min(ours), mo, max(ours)],
                      "ratio": round(mo / mb, 3), "pair_ratio_median": round(median(pairs), 3),
                      "runs": args.runs, "load": loads}))


if __name__ == "__main__":
    main()
