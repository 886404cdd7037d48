"""MPI start-up, in one run: batchyard's mpi distribution (mpirun on node 0 over 2 virtual
nodes, each orted started through the batchyard rsh agent, relayed by the server to that
node's launcher) against plain mpirun. Each rank records when its Python code started.

* mpirun -> ranks: from the moment mpirun is exec'd (a PATH wrapper, the same one for both,
  records it) to the last rank in user code: batchyard's mpirun on node 0 vs an equivalent
  two-"host" mpirun (same hostfile shape and MCA settings) whose rsh agent is a minimal shell
  script running the orted here. The difference is what the relay costs (target <= 30 ms).
* submit -> ranks: from the job's submission to the last rank, beside bare ``mpirun -np 4``.

    python bench/mpi_launch.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
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


# mpirun, as a wrapper that first notes when it was exec'd (bash's clock: no process spawned)
WRAPPER = """#!/bin/bash
[ -n "$RDV" ] && printf '%s' "$EPOCHREALTIME" > "$RDV/mpirun-started"
exec {real} "$@"
"""
# the least an rsh agent can do: drop ssh-style options and the host, run the command here
MINIMAL_AGENT = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
shift
exec /bin/sh -c "$*"
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def mpirun_started(rdv: Path) -> float:
    return float((rdv / "mpirun-started").read_text().strip())


def two_host(rdv: Path, tools: Path) -> float:
    """mpirun -> last rank in user code for the same layout as batchyard's (2 hosts x 2,
    every orted through an rsh agent, TCP over loopback) with the minimal shell agent."""
    hosts = tools / "hosts"
    hosts.write_text("node-a slots=2\nnode-b slots=2\n")
    from batchyard.node.ompi import ONE_SIDED

    argv = [str(tools / "bin" / "mpirun"), "--oversubscribe", "-np", "4", "--hostfile",
            str(hosts), "--bind-to", "none", "--mca", "rtc_hwloc_vmhole", "none",
            "--mca", "plm", "rsh", "--mca", "plm_rsh_agent", str(tools / "agent.sh"),
            "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
    for key, value in ONE_SIDED.items():  # what batchyard's line gives a multi-node gang
        argv += ["--mca", key, value]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    proc = subprocess.Popen([*argv, "-x", "RDV", sys.executable, "-c", PROBE],
                            env=dict(os.environ, RDV=str(rdv)), stdout=subprocess.DEVNULL)
    ranks = wait_files(rdv, 4)
    proc.wait()
    return max(float(r["started_at"]) for r in ranks) - mpirun_started(rdv)  # type: ignore[arg-type]


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


def through_batchyard(client: object, rdv: Path, i: int) -> tuple[float, float]:
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
    last = max(float(r["started_at"]) for r in ranks)  # type: ignore[arg-type]
    return last - t0, last - mpirun_started(rdv)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    bare_t, ours, two, ours_mpirun = [], [], [], []
    tools = Path(tempfile.mkdtemp(prefix="mpi-bench-tools-"))
    real = shutil.which("mpirun")
    if real is None:
        raise SystemExit("mpirun is not installed")
    (tools / "bin").mkdir()
    _executable(tools / "bin" / "mpirun", WRAPPER.format(real=real))
    _executable(tools / "agent.sh", MINIMAL_AGENT)
    # the server, its launchers and their mpirun find the wrapper first
    os.environ["PATH"] = f"{tools / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    with isolated_server():
        from batchyard.client.http import Client

        client = Client.connect(quiet=True)
        client.post("/workspaces/default/clusters", {"name": "local2",
                                                     "vm_size": "Standard_D2_v2",
                                                     "manual": {"target_node_count": 2}})
        for i in range(args.runs):
            for kind in ("bare", "two-host", "batchyard"):
                rdv = Path(tempfile.mkdtemp(prefix=f"mpi-{kind}-"))
                if kind == "bare":
                    bare_t.append(bare(rdv))
                elif kind == "two-host":
                    two.append(two_host(rdv, tools))
                else:
                    submitted, from_mpirun = through_batchyard(client, rdv, i)
                    ours.append(submitted)
                    ours_mpirun.append(from_mpirun)
                shutil.rmtree(rdv, ignore_errors=True)
        client.close()
    shutil.rmtree(tools, ignore_errors=True)
    mb, mo, mt, mr = median(bare_t), median(ours), median(two), median(ours_mpirun)
    print(f"mpirun exec'd -> all 4 MPI ranks in user code (2 hosts x 2), median of {args.runs}:")
    print(f"  mpirun, minimal sh rsh agent: {mt * 1000:8.1f} ms")
    print(f"  batchyard (relayed orteds)  : {mr * 1000:8.1f} ms")
    print(f"  overhead                    : {(mr - mt) * 1000:8.1f} ms   ratio {mr / mt:.2f}x"
          "   (target <= 30 ms)")
    print(f"submit -> all 4 MPI ranks running (2 nodes x 2), median of {args.runs}:")
    print(f"  bare mpirun -np 4           : {mb * 1000:8.1f} ms")
    print(f"  batchyard mpi job           : {mo * 1000:8.1f} ms")
    print(f"  overhead                    : {(mo - mb) * 1000:8.1f} ms   ratio {mo / mb:.2f}x")
    print(json.dumps({"two_host_mpirun_to_ranks_s": round(mt, 4),
                      "batchyard_mpirun_to_ranks_s": round(mr, 4),
                      "relay_overhead_ms": round((mr - mt) * 1000, 1),
                      "mpirun_median_s": round(mb, 4), "batchyard_median_s": round(mo, 4),
                      "overhead_ms": round((mo - mb) * 1000, 1)}))


if __name__ == "__main__":
    main()
