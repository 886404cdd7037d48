"""Submit-to-all-ranks-running for the 2x2 hello job through batchyard, against spawning the
same 4 processes directly, in one run.

Each rank of examples/hello-distributed records the time its user code started
(``--rendezvous``). batchyard's figure is measured from just before the job-create HTTP call
to the last rank's start; the bare figure from just before ``Popen`` of the 4 processes to the
last rank's start. Both include Python's start-up of the ranks, so the difference is
batchyard's overhead: API, scheduling, launchers, env contract.

    python bench/launch.py [--runs 15] [--ray] [--slurm]

``--ray`` adds two columns on a real Ray cluster started here (head + 2 raylets, token auth,
see tests/raykit.py): the same job through batchyard's Ray backend, and the same 4 rank
processes submitted with Ray's own job submission SDK (one entrypoint that starts them).

``--slurm`` adds two on a real Slurm started here (tests/slurmkit.py, root only): the job
through batchyard's Slurm backend, and a bare `sbatch` of the same 2-node job whose script
`srun`s the 4 ranks (bench/_slurm_launch.py).
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


def through_ray_jobs(jobs: object, rendezvous: Path) -> float:
    """Ray's job submission SDK: one entrypoint (a driver on the head) starting the 4 ranks."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    assert isinstance(jobs, JobSubmissionClient)
    starts = " ".join(
        f"RANK={r} WORLD_SIZE=4 LOCAL_RANK={r % 2} LOCAL_WORLD_SIZE=2 NODE_RANK={r // 2} "
        f"GROUP_RANK={r // 2} BATCHYARD_NODE_RANK={r // 2} BATCHYARD_NUM_NODES=2 "
        f"MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 AZ_BATCH_MASTER_NODE=127.0.0.1:29500 "
        f"AZ_BATCHAI_TASK_INDEX={r // 2} {sys.executable} {HELLO / 'hello.py'} --rendezvous "
        f"{rendezvous} --allow-missing & " for r in range(4))
    t0 = time.time()
    job_id = jobs.submit_job(entrypoint=f"{starts} wait")
    ranks = wait_files(rendezvous, 4)
    start = max(float(r["started_at"]) for r in ranks)  # type: ignore[arg-type]
    while jobs.get_job_status(job_id) not in (JobStatus.SUCCEEDED, JobStatus.FAILED,
                                              JobStatus.STOPPED):
        time.sleep(0.05)
    return start - t0


def through_batchyard(client: object, rendezvous: Path, i: int,
                      cluster: str = "local2") -> float:
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    # the ranks write into a local mount: a job writes nowhere but its own folders, and runs
    # as an unprivileged uid (hence the rendezvous folder open to all, outside /tmp)
    spec = {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
            "mounts": [{"kind": "local", "relative_path": "rv", "source": str(rendezvous)}],
            "command": ["python", str(HELLO / "hello.py"), "--rendezvous", str(rendezvous)]}
    t0 = time.time()
    client.post("/workspaces/default/jobs", {"spec": spec, "cluster": cluster,
                                             "name": f"bench-{cluster}-{i}"})
    ranks = wait_files(rendezvous, 4)
    start = max(float(r["started_at"]) for r in ranks)  # type: ignore[arg-type]
    path = client.job_path("default", "default", f"bench-{cluster}-{i}")
    while client.get(path)["state"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.05)
    return start - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--ray", action="store_true", help="add the Ray columns")
    parser.add_argument("--slurm", action="store_true", help="add the Slurm columns")
    args = parser.parse_args()
    rc = None
    if args.ray:
        sys.path.insert(0, str(ROOT / "tests"))
        from raykit import RayCluster

        rc = RayCluster("batchyard/big")
        rc.start_head(dashboard=True)
        rc.add_raylet("a")
        rc.add_raylet("b")
    times: dict[str, list[float]] = {"bare": [], "batchyard": [], "ray": [], "rayjobs": []}
    try:
        with isolated_server():
            from batchyard.client.http import Client

            client = Client.connect(quiet=True)
            client.post("/workspaces/default/clusters", {"name": "local2",
                                                         "vm_size": "Standard_D2_v2",
                                                         "manual": {"target_node_count": 2}})
            kinds = ["bare", "batchyard"]
            jobs = None
            if rc is not None:
                client.post("/workspaces/default/clusters", {
                    "name": "big", "backend": "ray", "address": rc.address,
                    "ray_token_file": str(rc.token_file)})
                os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=rc.token)
                from ray.job_submission import JobSubmissionClient

                jobs = JobSubmissionClient(f"http://127.0.0.1:{rc.dashboard_port}")
                kinds += ["ray", "rayjobs"]
            for i in range(args.runs):
                for kind in kinds:
                    rdv = Path(tempfile.mkdtemp(prefix=f"rdv-{kind}-", dir="/var/tmp"))
                    rdv.chmod(0o777)
                    if kind == "bare":
                        times[kind].append(bare(rdv))
                    elif kind == "rayjobs":
                        times[kind].append(through_ray_jobs(jobs, rdv))
                    else:
                        cluster = "big" if kind == "ray" else "local2"
                        times[kind].append(through_batchyard(client, rdv, i, cluster))
                    shutil.rmtree(rdv, ignore_errors=True)
            client.close()
    finally:
        if rc is not None:
            rc.stop()
    mb, md = median(times["bare"]), median(times["batchyard"])
    result = {"runs": args.runs, "bare_spawn_median_s": round(mb, 4),
              "batchyard_median_s": round(md, 4), "overhead_ms": round((md - mb) * 1000, 1),
              "ratio": round(md / mb, 2), "target_overhead_ms": 300}
    print(f"submit -> all 4 ranks running (2 nodes x 2), median of {args.runs}:")
    print(f"  bare spawn of 4 processes : {mb * 1000:8.1f} ms")
    print(f"  batchyard job create      : {md * 1000:8.1f} ms")
    print(f"  overhead                  : {(md - mb) * 1000:8.1f} ms  (target < 300 ms)")
    print(f"  ratio                     : {md / mb:8.2f}x")
    if rc is not None:
        mr, mj = median(times["ray"]), median(times["rayjobs"])
        result.update(ray_backend_median_s=round(mr, 4), ray_job_sdk_median_s=round(mj, 4),
                      ray_first_s=round(times["ray"][0], 4))
        print(f"  batchyard on Ray (2 raylets): {mr * 1000:8.1f} ms  (first run "
              f"{times['ray'][0] * 1000:.0f} ms)")
        print(f"  Ray job submission SDK    : {mj * 1000:8.1f} ms")
    if args.slurm:
        from _slurm_launch import run as slurm_run

        st = slurm_run(args.runs)
        sb, sy = median(st["bare"]), median(st["batchyard"])
        result.update(slurm_bare_sbatch_median_s=round(sb, 4),
                      slurm_batchyard_median_s=round(sy, 4),
                      slurm_overhead_ms=round((sy - sb) * 1000, 1), slurm_ratio=round(sy / sb, 2))
        print(f"on Slurm (2 slurmd hosts), median of {args.runs}:")
        print(f"  bare sbatch + srun        : {sb * 1000:8.1f} ms")
        print(f"  batchyard --backend slurm : {sy * 1000:8.1f} ms")
        print(f"  overhead                  : {(sy - sb) * 1000:8.1f} ms  ({sy / sb:.2f}x)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
