"""`bench/launch.py --slurm`: submit -> all 4 ranks in user code for the 2x2 hello job on a real
Slurm (tests/slurmkit.py: slurmctld and the batchyard server on a login host, slurmds on two
node hosts), through batchyard's Slurm backend and as a bare `sbatch` of the same 2-node job
(its script `srun`s the 4 ranks), in pairs whose order flips each time, in one run.

The test process cannot reach the hosts, so the timing loop runs inside the login host (DRIVER
below); the ranks write their start times into a rendezvous dir on the file system all hosts
share, and one clock serves every host."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _exectrace as exectrace

ROOT = Path(__file__).resolve().parents[1]
HELLO = ROOT / "examples" / "hello-distributed"
PORT = 18772
NODE_WORK = "/var/lib/batchyard/node"

DRIVER = r'''
import json, os, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from _harness import median, wait_files
from batchyard.client.http import Client

hello, runs, base = Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
client = Client.connect(quiet=True)
BARE = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --exclusive
#SBATCH --output=/dev/null
#SBATCH --chdir=/tmp
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
srun bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=4 LOCAL_RANK=$SLURM_LOCALID LOCAL_WORLD_SIZE=2 \
NODE_RANK=$SLURM_NODEID MASTER_PORT=29500 exec {py} {hello}/hello.py --rendezvous {rdv} \
--allow-missing'
"""

def gone(job_id):
    out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], text=True,
                         capture_output=True).stdout.strip()
    return out in ("", "COMPLETED")

def settle():
    """Both kinds start from the same state: every node idle, Slurm's scheduler quiet."""
    while subprocess.run(["sinfo", "-h", "-o", "%T"], text=True,
                         capture_output=True).stdout.split() != ["idle"]:
        time.sleep(0.05)
    time.sleep(0.5)

times = {"bare": [], "batchyard": [], "marks": []}

def bare_once(i):
    rdv = Path(tempfile.mkdtemp(prefix="rdv-bare-", dir=base))
    script = BARE.format(py=sys.executable, hello=hello, rdv=rdv)
    t0 = time.time()
    times["marks"].append(["bare", i, t0])
    job_id = int(subprocess.run(["sbatch", "--parsable"], input=script, text=True,
                                capture_output=True, check=True).stdout.split(";")[0])
    ranks = wait_files(rdv, 4, timeout=120)
    times["bare"].append(max(float(r["started_at"]) for r in ranks) - t0)
    while not gone(job_id):
        time.sleep(0.05)

def ours_once(i):
    # a local mount of the ranks', open to the job's unprivileged uid, outside /tmp
    rdv = Path(tempfile.mkdtemp(prefix="rdv-by-", dir="/var/tmp"))
    rdv.chmod(0o777)
    spec = {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
            "mounts": [{"kind": "local", "relative_path": "rv", "source": str(rdv)}],
            "command": ["python", str(hello / "hello.py"), "--rendezvous", str(rdv)]}
    t0 = time.time()
    times["marks"].append(["batchyard", i, t0])
    client.post("/workspaces/default/jobs", {"spec": spec, "cluster": "hpc",
                                             "name": f"bench-{i}"})
    ranks = wait_files(rdv, 4, timeout=120)
    times["batchyard"].append(max(float(r["started_at"]) for r in ranks) - t0)
    path = client.job_path("default", "default", f"bench-{i}")
    while client.get(path)["state"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.05)

for i in range(runs):  # pairs, the order flipping each time
    for one in ((bare_once, ours_once) if i % 2 == 0 else (ours_once, bare_once)):
        settle()
        one(i)
print(json.dumps(times))
'''


def run(runs: int, trace: Path | None = None) -> dict[str, Any]:
    """``trace``: strace every exec of the server and the slurmds (and all they start) into
    that folder while the runs go; ``timeline`` reads it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from slurmkit import NodeSpec, SlurmCluster

    nodes = (NodeSpec("sn1"), NodeSpec("sn2"))
    with SlurmCluster(nodes, partitions={"debug": ("sn1", "sn2")}).start() as sc:
        base = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
        home = base / "home"
        home.mkdir()
        env = {k: v for k, v in sc.env.items() if not k.startswith("BATCHYARD_")}
        url = f"https://{sc.login.addr}:{PORT}"
        env.update(BATCHYARD_HOME=str(home), NO_COLOR="1")
        cli = [sys.executable, "-m", "batchyard.cli.main"]
        started = sc.login.run([*cli, "server", "start", "--host", sc.login.addr, "--port",
                                str(PORT)], env=env, timeout=90)
        if started.returncode != 0:
            raise RuntimeError(f"server start failed: {started.stderr}")
        env["BATCHYARD_SERVER"] = url
        tracer = None
        try:
            made = sc.login.run([*cli, "cluster", "create", "-n", "hpc", "--backend", "slurm",
                                 "--partition", "debug", "--work-dir", NODE_WORK, "--cpus", "4",
                                 "--gpus", "0"], env=env, timeout=60)
            if made.returncode != 0:
                raise RuntimeError(f"cluster create failed: {made.stderr}")
            if trace is not None:
                server = json.loads((home / "server.json").read_text())["pid"]
                pids = {"server": int(server), **{n: sc.slurmd_pid(n) for n in ("sn1", "sn2")}}
                tracer = exectrace.start({k: v for k, v in pids.items() if v}, trace)
            proc = sc.login.run([sys.executable, "-c", DRIVER, str(ROOT / "bench"), str(HELLO),
                                 str(runs), str(base)], env=env, timeout=120 + 60 * runs)
            if proc.returncode != 0:
                raise RuntimeError(f"the driver failed: {proc.stderr[-3000:]}")
            times: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
            return times
        finally:
            exectrace.stop(tracer)
            sc.login.run([*cli, "server", "stop"], env=env, timeout=60)
            subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Slurm launch timeline (strace of execs)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trace", type=Path, default=Path(tempfile.mkdtemp(prefix="slurm-tr-")))
    args = parser.parse_args()
    got = run(args.runs, args.trace)
    print(exectrace.timeline(args.trace, got["marks"], got))
    print(json.dumps({k: v for k, v in got.items() if k != "marks"}))
