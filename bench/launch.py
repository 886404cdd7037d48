"""Submit-to-all-ranks-running for the 2x2 hello job through batchyard, against spawning the
same 4 processes directly and against torchrun, in one run, alternated (every kind once per
round, the order rotating from round to round); each kind's min/median/max, its overhead
over the bare spawn and the ratio of medians, with the load average.

Each rank of examples/hello-distributed records the time its user code started
(``--rendezvous``). batchyard's figure is measured from just before the job-create HTTP call
to the last rank's start; the bare figure from just before ``Popen`` of the 4 processes to the
last rank's start. Both include Python's start-up of the ranks, so the difference is
batchyard's overhead: API, scheduling, launchers, env contract. Kinds:

* bare: the 4 rank processes spawned here;
* torchrun: two torchrun agents (``--nnodes 2 --nproc-per-node 2``, static rendezvous on
  this host), what a user of one machine would type instead;
* batchyard: the job submitted with the HTTP client in this process;
* cli: `batchyard job create -f job.yaml` as a user types it (a new process: its start-up,
  import and connection are in the figure), timed to the last rank in user code.

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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _exectrace as exectrace
from _harness import ROOT, free_port, isolated_server, load, median, wait_files

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


def torchrun(rendezvous: Path) -> float:
    """Two torchrun agents (node ranks 0 and 1) of 2 processes each, as on two machines."""
    port = free_port()
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                               "--nproc-per-node", "2", "--node-rank", str(node),
                               "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "hello.py", "--rendezvous", str(rendezvous), "--allow-missing"],
                              cwd=HELLO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=dict(CLI_ENV, PYTHONUNBUFFERED="1"))
             for node in (0, 1)]
    ranks = wait_files(rendezvous, 4)
    for p in procs:
        p.wait()
    return max(float(r["started_at"]) for r in ranks) - t0  # type: ignore[arg-type]


def rendezvous_dir(kind: str) -> Path:
    """Where ranks write their rendezvous: a local mount of theirs, open to the job's
    unprivileged uid, outside /tmp (a job has a /tmp of its own)."""
    rdv = Path(tempfile.mkdtemp(prefix=f"rdv-{kind}-", dir="/var/tmp"))
    rdv.chmod(0o777)
    return rdv


def through_cli(client: object, rendezvous: Path, i: int, work: Path) -> float:
    """`batchyard job create -f job.yaml` in a new process, as typed; to the last rank."""
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    job = work / f"job-{i}.yaml"
    job.write_text(json.dumps({"nodes": 2, "distribution": {"type": "pytorch",
                                                            "processes_per_node": 2},
                               "mounts": [{"kind": "local", "relative_path": "rv",
                                           "source": str(rendezvous)}],
                               "command": ["python", str(HELLO / "hello.py"), "--rendezvous",
                                           str(rendezvous)]}))
    script = Path(sys.executable).with_name("batchyard")
    argv = [str(script)] if script.is_file() else [sys.executable, "-m", "batchyard.cli.main"]
    t0 = time.time()
    subprocess.run([*argv, "job", "create", "-f", str(job), "-c", "local2", "-n", f"cli-{i}"],
                   check=True, stdout=subprocess.DEVNULL, env=CLI_ENV)
    ranks = wait_files(rendezvous, 4)
    start = max(float(r["started_at"]) for r in ranks)  # type: ignore[arg-type]
    note_phases(client, client.job_path("default", "default", f"cli-{i}"), t0, start, "cli")
    return start - t0


# The CLI as installed: .pyc files written once, to a cache of its own (this machine sets
# PYTHONDONTWRITEBYTECODE, under which an editable install compiles itself on every run).
CLI_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
CLI_ENV["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="launch-bench-pyc-")


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
    note_phases(client, path, t0, start, "batchyard" if cluster == "local2" else "ray")
    return start - t0


PHASES: dict[str, dict[str, list[float]]] = {}


def note_phases(client: Any, path: str, t0: float, start: float, kind: str) -> None:
    """Waits for the job's end; notes when its launchers started and started their ranks
    (their own reports), in seconds after the submit."""
    while (job := client.get(path))["state"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.05)
    nodes = (job.get("attempts") or [{}])[-1].get("nodes") or []
    got = PHASES.setdefault(kind, {})
    for key, field, pick in (("launcher started", "started_at", min),
                             ("ranks spawned", "running_at", max)):
        stamps = [float(n[field]) for n in nodes if n.get(field)]
        if stamps:
            got.setdefault(key, []).append(pick(stamps) - t0)
    got.setdefault("ranks in user code", []).append(start - t0)


def summary(times: dict[str, list[float]], base: str = "bare") -> dict[str, Any]:
    """min/median/max per kind, its overhead over ``base`` and the ratio of medians."""
    mb = median(times[base])
    out: dict[str, Any] = {}
    for kind, values in times.items():
        if not values:
            continue
        med = median(values)
        out[kind] = {"ms": [round(min(values) * 1000, 1), round(med * 1000, 1),
                            round(max(values) * 1000, 1)],
                     "overhead_ms": round((med - mb) * 1000, 1), "ratio": round(med / mb, 2)}
        print(f"  {LABELS.get(kind, kind):34s} {min(values) * 1000:8.1f} {med * 1000:8.1f} "
              f"{max(values) * 1000:8.1f}   +{(med - mb) * 1000:7.1f} ms   x{med / mb:5.2f}")
    return out


LABELS = {"bare": "bare spawn of 4 processes", "torchrun": "torchrun (2 agents x 2)",
          "batchyard": "batchyard, HTTP client", "cli": "batchyard job create -f (CLI)",
          "ray": "batchyard on Ray (2 raylets)", "rayjobs": "Ray job submission SDK",
          "sbatch": "bare sbatch + srun", "slurm": "batchyard --backend slurm"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15, help="alternated rounds")
    parser.add_argument("--ray", action="store_true", help="add the Ray columns")
    parser.add_argument("--slurm", action="store_true", help="add the Slurm columns")
    parser.add_argument("--trace", type=Path, help="strace the server's execs (and its "
                        "launchers', sandboxes', ranks') into this folder; print a timeline")
    args = parser.parse_args()
    rc = None
    if args.ray:
        sys.path.insert(0, str(ROOT / "tests"))
        from raykit import RayCluster

        rc = RayCluster("batchyard/big")
        rc.start_head(dashboard=True)
        rc.add_raylet("a")
        rc.add_raylet("b")
    kinds = ["bare", "torchrun", "batchyard", "cli"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    loads = [load()]
    work = Path(tempfile.mkdtemp(prefix="launch-bench-"))
    try:
        with isolated_server() as home:
            from batchyard.client.http import Client

            CLI_ENV["BATCHYARD_HOME"] = str(home)
            client = Client.connect(quiet=True)
            client.post("/workspaces/default/clusters", {"name": "local2",
                                                         "vm_size": "Standard_D2_v2",
                                                         "manual": {"target_node_count": 2}})
            jobs = None
            if rc is not None:
                client.post("/workspaces/default/clusters", {
                    "name": "big", "backend": "ray", "address": rc.address,
                    "ray_token_file": str(rc.token_file)})
                os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=rc.token)
                from ray.job_submission import JobSubmissionClient

                jobs = JobSubmissionClient(f"http://127.0.0.1:{rc.dashboard_port}")
                kinds += ["ray", "rayjobs"]
                times.update(ray=[], rayjobs=[])
            tracer = None
            if args.trace is not None:
                from batchyard.config import read_server_info

                info = read_server_info()
                assert info is not None and info.pid is not None
                tracer = exectrace.start({"server": info.pid}, args.trace)
            marks: list[Any] = []
            # not timed: the .pyc files of the CLI and of torch are written once (an
            # installed package has them)
            warm = rendezvous_dir("warm")
            torchrun(warm)
            through_cli(client, rendezvous_dir("warm"), -1, work)
            for i in range(args.runs):
                for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
                    marks.append([kind, len(times[kind]), time.time()])
                    rdv = rendezvous_dir(kind)
                    if kind == "bare":
                        times[kind].append(bare(rdv))
                    elif kind == "torchrun":
                        times[kind].append(torchrun(rdv))
                    elif kind == "cli":
                        times[kind].append(through_cli(client, rdv, i, work))
                    elif kind == "rayjobs":
                        times[kind].append(through_ray_jobs(jobs, rdv))
                    else:
                        cluster = "big" if kind == "ray" else "local2"
                        times[kind].append(through_batchyard(client, rdv, i, cluster))
                    shutil.rmtree(rdv, ignore_errors=True)
                loads.append(load())
            exectrace.stop(tracer)
            client.close()
    finally:
        if rc is not None:
            rc.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(CLI_ENV["PYTHONPYCACHEPREFIX"], ignore_errors=True)
    print(f"submit -> all 4 ranks in user code (2 nodes x 2), {args.runs} alternated rounds; "
          f"ms min/median/max, overhead and ratio of medians to the bare spawn; load "
          f"{loads[0]} .. {loads[-1]}:")
    result: dict[str, Any] = {"runs": args.runs, "load": [loads[0], loads[-1]],
                              "local": summary(times)}
    print("phases (the launchers' own reports), ms after the submit, median:")
    for kind, got in PHASES.items():
        print(f"  {LABELS.get(kind, kind):34s} " + ", ".join(
            f"{k} {median(v) * 1000:.0f}" for k, v in got.items()))
    result["phases_ms"] = {kind: {k: round(median(v) * 1000, 1) for k, v in got.items()}
                           for kind, got in PHASES.items()}
    if args.trace is not None:
        print("execs after each submit (strace of the server and all it starts):")
        print(exectrace.timeline(args.trace, [m for m in marks if m[0] in ("batchyard", "cli")],
                                 times))
    if rc is not None:
        print(f"  (batchyard on Ray, first run {times['ray'][0] * 1000:.0f} ms; "
              f"on Ray / Ray job SDK: x{median(times['ray']) / median(times['rayjobs']):.2f})")
        result["ray_over_rayjobs"] = round(median(times["ray"]) / median(times["rayjobs"]), 2)
    if args.slurm:
        from _slurm_launch import run as slurm_run

        before = load()
        st = slurm_run(args.runs)
        print(f"on Slurm (2 slurmd hosts), {args.runs} alternated pairs; load {before} .. "
              f"{load()}:")
        result["slurm"] = summary({"sbatch": st["bare"], "slurm": st["batchyard"]}, "sbatch")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
