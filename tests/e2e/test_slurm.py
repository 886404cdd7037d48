"""batchyard on a real Slurm (tests/slurmkit.py): slurmctld and the batchyard server on a
``login`` host, one slurmd per node host (network + UTS + mount namespaces, private work
dirs), partition ``debug`` = sn1, sn2. A ``--backend slurm`` cluster on that partition.

Checked: nodes come from the partition (addresses, CPUs, GPUs from Gres, drained nodes
unusable with Slurm's reason); autoscale, resize and impossible jobs are refused; `--dry-run`
prints the batch script; the examples (hello-distributed, mnist-ddp over gloo, mnist-mpi over
Open MPI through the relay) with the env contract and SLURM_* passed through; live logs; a
job behind another shows Slurm's pending reason; terminate leaves no process and no Slurm job;
a killed slurmd fails the job naming its node; a server killed with SIGKILL and restarted
mid-job; the seed 001 notebook on a Slurm-backed compute target.

Root only (namespaces): skipped elsewhere. Marked slow."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import strictkit
from sitekit import (
    EXAMPLES,
    PY,
    TERMINAL,
    Site,
    assert_nothing_left,
    download,
    example,
    rank_lines,
    show,
)
from slurmkit import WORK_DIR, SlurmCluster, slurm
from yardkit import pid_alive, wait_until

__all__ = ["slurm"]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

PORT = 18762
CLUSTER = "hpc"
NODE_WORK = f"{WORK_DIR}/node"


class Hpc(Site):
    slurm: SlurmCluster

    def host(self, name: str) -> Any:
        return self.slurm.nodes[name]

    def hosts_of(self, job: dict[str, Any]) -> list[Any]:
        return [self.host(n["node"]) for n in job["attempts"][-1].get("nodes") or []]

    def slurm_jobs_named(self, prefix: str) -> list[dict[str, Any]]:
        return [j for j in self.slurm.jobs().values() if str(j["name"]).startswith(prefix)]


@pytest.fixture(scope="module")
def hpc(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hpc]:
    base = tmp_path_factory.mktemp("slurmsite")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in slurm.env.items()
           if not k.startswith(("BATCHYARD_", "AZ_BATCHAI_", "AZ_BATCH_", "AZUREML_"))}
    env.update({"BATCHYARD_HOME": str(home), "NO_COLOR": "1", "TERM": "dumb",
                "COLUMNS": "250", "PYTHONUNBUFFERED": "1"})
    url = f"https://{slurm.login.addr}:{PORT}"
    env["BATCHYARD_SERVER"] = url
    assert slurm.net is not None
    site = Hpc(slurm.net, slurm.login, home, work, env, url, PORT, CLUSTER)
    site.slurm = slurm
    site.start_server()
    try:
        site.ok("cluster", "create", "-n", CLUSTER, "--backend", "slurm", "--partition",
                "debug", "--work-dir", NODE_WORK)
        site.wait_nodes(2, ("idle",), timeout=30)
        yield site
    finally:
        site.cli("server", "stop", timeout=60)
        slurm.reset()


def write_job(hpc: Hpc, name: str, spec: dict[str, Any]) -> Path:
    return hpc.write_job(name, spec)


def submit(hpc: Hpc, name: str, spec: dict[str, Any]) -> None:
    hpc.submit(write_job(hpc, name, spec), name)


# --- nodes and refusals -----------------------------------------------------------------------


def test_nodes_come_from_the_partition(hpc: Hpc) -> None:
    nodes = {n["name"]: n for n in hpc.js("cluster", "node", "list", "-c", CLUSTER)}
    assert sorted(nodes) == ["sn1", "sn2"], nodes
    for name, node in nodes.items():
        assert node["address"] == hpc.slurm.addrs[name], node
        assert node["state"] == "idle", node
    shown = hpc.js("cluster", "show", "-n", CLUSTER)
    assert shown["backend"] == "slurm", shown
    size = json.dumps(shown)
    assert '"vcpus": 4' in size and '"gpus": 1' in size, shown  # Gres=gpu:1, 4 CPUs
    hpc.slurm.drain("sn2", "bad dimm")
    try:
        wait_until(lambda: {n["name"]: n for n in hpc.js("cluster", "node", "list", "-c",
                                                          CLUSTER)}["sn2"]["state"]
                   == "unusable", 15, what="sn2 unusable")
        sn2 = {n["name"]: n for n in hpc.js("cluster", "node", "list", "-c", CLUSTER)}["sn2"]
        assert "bad dimm" in json.dumps(sn2) and "DRAIN" in json.dumps(sn2), sn2
    finally:
        hpc.slurm.resume("sn2")
    hpc.wait_nodes(2, ("idle",), timeout=20)


def test_slurm_owns_its_nodes(hpc: Hpc) -> None:
    res = hpc.cli("cluster", "create", "-n", "auto", "--backend", "slurm", "--max", "3")
    assert res.returncode == 2 and "Slurm owns its nodes" in res.stderr, show(res)
    res = hpc.cli("cluster", "resize", "-n", CLUSTER, "-t", "5")
    assert res.returncode == 2 and "Slurm" in res.stderr, show(res)
    res = hpc.cli("cluster", "create", "-n", "nopart", "--backend", "slurm", "--partition",
                  "nosuch")
    assert res.returncode == 2 and "nosuch" in res.stderr and "debug" in res.stderr, show(res)
    res = hpc.cli("cluster", "create", "-n", "own", "--backend", "slurm", "--slurm-option",
                  "nodes=7")
    assert res.returncode == 2 and "--nodes" in res.stderr, show(res)
    assert "Traceback" not in res.stderr


def test_job_bigger_than_the_partition_is_rejected(hpc: Hpc) -> None:
    path = write_job(hpc, "toobig", {"nodes": 3, "command": "true"})
    res = hpc.cli("job", "create", "-f", str(path), "-n", "toobig", "-c", CLUSTER)
    assert res.returncode == 2, show(res)
    assert "3 nodes" in res.stderr and "at most 2" in res.stderr, show(res)
    assert "toobig" not in hpc.ok("job", "list")


def test_dry_run_prints_the_batch_script(hpc: Hpc) -> None:
    path = write_job(hpc, "dry", {
        "nodes": 2, "command": "python -c 'print(1)'", "limits": {"max_wall_clock": "1h"},
        "distribution": {"type": "pytorch", "processes_per_node": 2}})
    out = hpc.js("job", "create", "-f", str(path), "-n", "dry", "-c", CLUSTER, "--dry-run")
    plan = out["plan"]
    for want in ("#!/bin/bash", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --gres=gpu:1", "#SBATCH --partition=debug",
                 "#SBATCH --time=63", f"exec >>{NODE_WORK}/slurm-", "srun "):
        assert want in plan, plan
    assert "launch." not in plan and "***" in plan, plan
    assert "dry" not in hpc.ok("job", "list")


# --- the examples -----------------------------------------------------------------------------


def test_hello_distributed(hpc: Hpc) -> None:
    folder = example(hpc, "hello-distributed")
    hpc.submit(folder / "job.yaml", "hello", cwd=folder)
    job = hpc.wait_job("hello", timeout=90)
    logs = hpc.logs("hello")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs}"
    node0, node1 = hpc.hosts_of(job)
    assert [node0.name, node1.name] == ["sn1", "sn2"]
    for rank in range(4):
        lines = "\n".join(rank_lines(logs, rank))
        host = node0 if rank < 2 else node1
        assert f"hello from {host.name} " in lines, logs
        assert f"MASTER_ADDR={node0.addr} " in lines, logs
        assert f"BATCHYARD_NODE_IPS: {node0.addr}, {node1.addr}" in lines, logs
        assert "env contract OK" in lines, logs
    dest = download(hpc, "hello", "outputs/RESULT/summary.json")
    summary = json.loads((dest / "outputs" / "RESULT" / "summary.json").read_text())
    assert summary["node_ips"] == [node0.addr, node1.addr], summary
    assert summary["rank0_hostname"] == "sn1"
    assert not hpc.slurm_jobs_named("by-hello-") or all(
        j["job_state"] == "COMPLETED" for j in hpc.slurm_jobs_named("by-hello-"))


ENV_PROBE = ('echo "probe rank=$RANK node=$BATCHYARD_NODE_RANK master=$MASTER_ADDR '
             'slurm_job=$SLURM_JOB_ID slurm_node=$SLURM_NODEID slurmd=$SLURMD_NODENAME '
             'token=${BATCHYARD_SLURM_TICKETS:-none}"')


def test_env_contract_and_slurm_variables(hpc: Hpc) -> None:
    submit(hpc, "envprobe", {"nodes": 2, "command": ENV_PROBE,
                             "distribution": {"type": "pytorch", "processes_per_node": 1}})
    job = hpc.wait_job("envprobe", timeout=60)
    logs = hpc.logs("envprobe")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs}"
    probes = sorted(re.findall(r"probe (rank=\d node=\d master=\S+ slurm_job=\d+ "
                               r"slurm_node=\d slurmd=\S+) token=(\S+)", logs))
    assert len(probes) == 2, logs
    ids = {re.search(r"slurm_job=(\d+)", p[0])[1] for p in probes}  # type: ignore[index]
    assert len(ids) == 1, probes
    master = hpc.slurm.addrs["sn1"]
    assert probes[0][0].startswith(f"rank=0 node=0 master={master} ") and "slurmd=sn1" in \
        probes[0][0], probes
    assert probes[1][0].startswith(f"rank=1 node=1 master={master} ") and \
        "slurm_node=1 slurmd=sn2" in probes[1][0], probes
    assert all(p[1] == "none" for p in probes), probes  # the tickets never reach a rank


def test_job_environment_is_its_own(hpc: Hpc) -> None:
    """A rank sees its account (HOME, USER), Slurm's variables and the env contract; not the
    server's environment (NO_COLOR, COLUMNS: set for the server here), and not a login
    environment (slurmd is never asked to build one: SLURM_GET_USER_ENV, a second or more
    per job)."""
    submit(hpc, "envown", {"nodes": 2, "command": "env | sed 's/^/envline /'",
                           "distribution": {"type": "pytorch", "processes_per_node": 1}})
    job = hpc.wait_job("envown", timeout=60)
    logs = hpc.logs("envown")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs}"
    for rank in (0, 1):
        names = {line.split()[1].split("=", 1)[0] for line in rank_lines(logs, rank)
                 if line.startswith("envline ")}
        assert {"HOME", "USER", "LOGNAME", "PATH", "SLURM_JOB_ID", "RANK", "MASTER_ADDR",
                "AZ_BATCHAI_TASK_INDEX"} <= names, sorted(names)
        assert not names & {"NO_COLOR", "COLUMNS", "SLURM_GET_USER_ENV", "BATCHYARD_HOME",
                            "SLURM_EXPORT_ENV"}, sorted(names)


def test_mnist_ddp(hpc: Hpc) -> None:
    """On a CPU-sized cluster (``--gpus 0``) of the same partition: the partition's GPUs are
    fake devices here that no collective library could use, and a gang of this size gets
    none from Slurm (no CUDA_VISIBLE_DEVICES), so the example runs DDP over gloo, and says
    so (NCCL is what a GPU-sized gang on real GPUs would get)."""
    hpc.ok("cluster", "create", "-n", "cpu", "--backend", "slurm", "--partition", "debug",
           "--work-dir", NODE_WORK, "--cpus", "4", "--gpus", "0", "--memory", "3")
    folder = example(hpc, "mnist-ddp")
    spec = (folder / "job.yaml").read_text()
    job_file = folder / "job-short.yaml"
    job_file.write_text(spec.replace("--epochs 5", "--epochs 2"))
    hpc.ok("job", "create", "-f", str(job_file), "-n", "ddp", "-c", "cpu", cwd=folder,
           timeout=120)
    job = hpc.wait_job("ddp", timeout=200)
    logs = hpc.logs("ddp")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-4000:]}"
    assert "world size 4, backend gloo" in logs, logs[-3000:]
    assert "backend nccl" not in logs, logs[-3000:]
    assert re.search(r"test accuracy: 0\.[89]", logs), logs[-3000:]


def test_mnist_mpi_through_the_relay(hpc: Hpc) -> None:
    folder = example(hpc, "mnist-mpi")
    hpc.submit(folder / "job.yaml", "mpi", cwd=folder)
    job = hpc.wait_job("mpi", timeout=240)
    logs = hpc.logs("mpi")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-4000:]}"
    node0, node1 = hpc.hosts_of(job)
    assert "MPI world size 8" in "\n".join(rank_lines(logs, 0)), logs[-3000:]
    files = [f["path"] for f in hpc.js("job", "file", "list", "-n", "mpi")["files"]]
    for rank in range(8):
        node = (node0 if rank < 4 else node1).name
        assert f"stdouterr/{node}-rank{rank}.stdout.txt" in files, files
    assert re.search(r"test accuracy: 0\.9", logs), logs[-3000:]


# --- live logs, the queue, terminate ----------------------------------------------------------

NUMBERED = ('echo "rank $RANK up"; for i in $(seq 1 {n}); do echo "rank $RANK line $i"; '
            'sleep {pause}; done')


def numbered_job(hpc: Hpc, name: str, lines: int = 30, pause: float = 0.2, **spec: Any) -> None:
    submit(hpc, name, {"nodes": 2, "command": NUMBERED.format(n=lines, pause=pause),
                       "limits": {"grace_period": 2},
                       "distribution": {"type": "pytorch", "processes_per_node": 1}, **spec})


def test_logs_follow_live(hpc: Hpc) -> None:
    numbered_job(hpc, "live", lines=40, pause=0.25)
    out = hpc.work / "live-follow.txt"
    with open(out, "wb") as fh:
        follower = hpc.server.popen([PY, "-m", "batchyard.cli.main", "job", "logs", "-n", "live",
                                     "-f"], env=hpc.env, stdout=fh, stderr=subprocess.STDOUT,
                                    cwd=hpc.work)
    try:
        wait_until(lambda: "rank 1 line 3" in out.read_text(), 60,
                   what="a live line through job logs -f")
        assert hpc.job("live")["state"] == "running"  # seen while the job still runs
        follower.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            follower.kill()
    text = out.read_text()
    for rank in (0, 1):
        assert f"rank {rank} line 40" in text, text[-2000:]
    assert hpc.wait_job("live", timeout=30)["state"] == "succeeded"


def test_queue_reason_and_terminate(hpc: Hpc) -> None:
    numbered_job(hpc, "holder", lines=600, pause=0.1)
    hpc.wait_job("holder", ("running", *TERMINAL), timeout=60)
    numbered_job(hpc, "waiter", lines=2)

    def waiting() -> str:
        job = hpc.job("waiter")
        assert job["state"] == "queued", job
        return str(job.get("pending_reason") or "")

    wait_until(lambda: re.search(r"Slurm job \d+ pending: (Resources|Priority)", waiting()),
               20, what="Slurm's reason on the waiting job")
    reason = waiting()
    slurm_id = int(re.search(r"Slurm job (\d+)", reason)[1])  # type: ignore[index]
    assert hpc.slurm.jobs()[slurm_id]["job_state"] == "PENDING"
    shown = hpc.ok("job", "show", "-n", "waiter")
    assert "pending" in shown.lower() and str(slurm_id) in shown, shown
    assert hpc.job("waiter")["attempts"][-1]["slurm_job_id"] == slurm_id
    # terminate while queued in Slurm: canceled, and gone from Slurm's queue
    hpc.ok("job", "terminate", "-n", "waiter")
    assert hpc.wait_job("waiter", timeout=20)["state"] == "canceled"
    wait_until(lambda: hpc.slurm.job_state(slurm_id) in (None, "CANCELLED"), 15,
               what="the waiting Slurm job cancelled")
    # terminate while running: no process on any host, the Slurm job gone from squeue
    job = hpc.job("holder")
    hosts = hpc.hosts_of(job)
    holder_id = job["attempts"][-1]["slurm_job_id"]
    assert holder_id in hpc.slurm.jobs(), holder_id
    hpc.ok("job", "terminate", "-n", "holder")
    job = hpc.wait_job("holder", timeout=40)
    assert job["state"] == "canceled", job
    assert_nothing_left(hosts, job, timeout=15)
    wait_until(lambda: hpc.slurm.job_state(holder_id) not in
               ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING"), 20,
               what="the Slurm job of the terminated job ended")
    assert not [line for line in hpc.slurm.active_jobs() if line.startswith(str(holder_id))]
    hpc.slurm.wait_idle(30)


# --- faults -----------------------------------------------------------------------------------


def test_killed_slurmd_fails_the_job_naming_its_node(hpc: Hpc) -> None:
    numbered_job(hpc, "nodefail", lines=900, pause=0.1)
    hpc.wait_job("nodefail", ("running", *TERMINAL), timeout=60)
    wait_until(lambda: hpc.logs("nodefail").count(" up\n") >= 2, 20, what="both ranks up")
    hosts = hpc.hosts_of(hpc.job("nodefail"))
    try:
        hpc.slurm.kill_slurmd("sn2")
        job = hpc.wait_job("nodefail", timeout=90)
        assert job["state"] == "failed", job
        assert "sn2" in job["message"] and "sn1" not in job["message"], \
            (job["message"], job["events"], job["attempts"][-1], hpc.server_log_tail(6000))
        assert_nothing_left(hosts, job, timeout=30)
    finally:
        hpc.slurm.reset(timeout=60)
    hpc.wait_nodes(2, ("idle",), timeout=30)


def test_slurm_preemption_requeues_the_job(hpc: Hpc) -> None:
    """A job of the urgent partition (a higher PriorityTier, PreemptMode=CANCEL) takes the
    nodes: Slurm preempts the batchyard job, which goes back to batchyard's queue (no retry
    used up), waits with Slurm's reason, and runs again once the urgent job is done."""
    numbered_job(hpc, "preempted", lines=50, pause=0.2)
    hpc.wait_job("preempted", ("running", *TERMINAL), timeout=60)
    wait_until(lambda: hpc.logs("preempted").count(" up\n") >= 2, 20, what="both ranks up")
    urgent = hpc.slurm.sbatch("#!/bin/bash\nsleep 4\n", "--partition=urgent", "--nodes=2",
                              "--exclusive", "--output=/dev/null")

    def attempts() -> list[dict[str, Any]]:
        return list(hpc.job("preempted")["attempts"])

    wait_until(lambda: len(attempts()) >= 2 or hpc.job("preempted")["state"] in TERMINAL, 60,
               what="a second attempt after the preemption")
    first = attempts()[0]
    job = hpc.job("preempted")
    assert len(attempts()) >= 2, json.dumps({k: job[k] for k in ("state", "message", "events")})
    assert first["state"] == "preempted" and "preempted by Slurm" in first["message"], first
    job = hpc.wait_job("preempted", timeout=120)
    assert job["state"] == "succeeded", job
    assert hpc.slurm.job_state(urgent) in (None, "COMPLETED")
    events = " | ".join(str(e["message"]) for e in job["events"])
    assert "requeued" in events, events


def test_server_killed_and_restarted_mid_job(hpc: Hpc) -> None:
    numbered_job(hpc, "restart", lines=60, pause=0.2)
    hpc.wait_job("restart", ("running", *TERMINAL), timeout=60)
    wait_until(lambda: hpc.logs("restart").count(" up\n") >= 2, 20, what="both ranks up")
    pid = hpc.server_pid()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 5, what="the server to die")
    time.sleep(3)
    hpc.start_server()
    job = hpc.wait_job("restart", timeout=90)
    logs = hpc.logs("restart")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-3000:]}"
    assert len(job["attempts"]) == 1, job["attempts"]
    for rank in (0, 1):
        lines = [line for line in rank_lines(logs, rank) if " line " in line]
        assert lines == [f"rank {rank} line {i}" for i in range(1, 61)], lines
        assert rank_lines(logs, rank).count(f"rank {rank} up") == 1
    assert len(hpc.slurm_jobs_named("by-restart-")) <= 1  # one Slurm job, never resubmitted


def test_server_killed_between_sbatch_and_the_start(hpc: Hpc) -> None:
    """The job was handed to Slurm (sbatch answered) and waits there (its nodes drained) when
    the server dies; Slurm starts it while no server answers (its launchers' plan requests,
    the start callback, are refused and retried); the restarted server runs it exactly once:
    one attempt, one Slurm job, every line once."""
    for name in ("sn1", "sn2"):
        hpc.slurm.drain(name, "held by the test")
    try:
        numbered_job(hpc, "handed", lines=20, pause=0.1)
        wait_until(lambda: re.search(r"Slurm job \d+ pending", str(
            hpc.job("handed").get("pending_reason") or "")), 30, what="the job waiting in Slurm")
        slurm_id = int(re.search(r"Slurm job (\d+)",  # type: ignore[index]
                                 str(hpc.job("handed")["pending_reason"]))[1])
        pid = hpc.server_pid()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 5, what="the server to die")
    finally:
        for name in ("sn1", "sn2"):
            hpc.slurm.resume(name)
    wait_until(lambda: hpc.slurm.job_state(slurm_id) not in (None, "PENDING"), 60,
               what="Slurm starting the handed job with no server")
    time.sleep(2)  # its launchers retry their plan requests meanwhile
    hpc.start_server()
    job = hpc.wait_job("handed", timeout=90)
    logs = hpc.logs("handed")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-3000:]}"
    assert len(job["attempts"]) == 1 and job["attempts"][0]["slurm_job_id"] == slurm_id, \
        job["attempts"]
    assert [j["job_id"] for j in hpc.slurm_jobs_named("by-handed-")] in ([], [slurm_id])
    for rank in (0, 1):
        lines = [line for line in rank_lines(logs, rank) if " line " in line]
        assert lines == [f"rank {rank} line {i}" for i in range(1, 21)], lines
    hpc.wait_nodes(2, ("idle",), timeout=30)


# --- seed 001 on a Slurm-backed compute target ------------------------------------------------


def test_seed001_notebook_on_slurm(hpc: Hpc) -> None:
    if shutil.which("mpirun") is None:
        strictkit.missing("needs Open MPI")
    """On a Slurm login node, BATCHYARD_BACKEND=slurm (and the partition) makes the notebook's
    AmlCompute target a Slurm-backed cluster: not a line of the notebook changes."""
    notebook = hpc.work / "notebook"
    notebook.mkdir()
    for name in ("seed001.py", "pytorch_horovod_mnist.py"):
        shutil.copy(EXAMPLES / "azureml-seed001" / name, notebook / name)
    env = dict(hpc.env, BATCHYARD_BACKEND="slurm", BATCHYARD_SLURM_PARTITION="wide",
               BATCHYARD_SLURM_WORK_DIR=NODE_WORK)
    proc = hpc.server.run([PY, "seed001.py"], env=env, timeout=300, cwd=notebook)
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "Creating 'gpucluster' on Slurm" in out, out[-3000:]
    shown = hpc.js("cluster", "show", "-n", "gpucluster", "-w", "seed-workspace")
    assert shown["backend"] == "slurm" and '"partition": "wide"' in json.dumps(shown), shown
    assert "MPI world size 2" in out and "Test set: Accuracy" in out, out[-3000:]
    assert re.search(r"\[sn\d/rank0\]", out), out[-3000:]
