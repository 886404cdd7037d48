"""Every distribution (pytorch, mpi, tensorflow, custom) on a real 2-node local cluster, with the
environment contract checked rank by rank; a user's own ``mpirun -hostfile`` in a custom job;
``$AZ_BATCHAI_*`` expansion of Batch AI paths through a real job; and a rank that aborts
(SIGABRT) taking its gang down.

All jobs of the module are submitted up front (they queue on the one cluster and run one after
the other); every test waits for its own job and reads the env dumps its ranks left behind.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from yardkit import Yard

pytestmark = pytest.mark.timeout(300)

EXP = "dist"
NODE0, NODE1 = "local2-0", "local2-1"

# Each process dumps its environment (plus a few facts it checked) as JSON into the MODEL
# output, named by its rank (OMPI_COMM_WORLD_RANK under mpirun, RANK otherwise).
DUMP = """\
import json, os, socket, sys

env = dict(os.environ)
rank = env.get("OMPI_COMM_WORLD_RANK") or env.get("RANK") or "single"
facts = {"argv": sys.argv[1:], "pid": os.getpid(), "executable": sys.executable}
hostfile = env.get("AZ_BATCHAI_MPI_HOST_FILE")
if hostfile and os.path.isfile(hostfile):
    facts["hostfile"] = open(hostfile).read()
if "--check-master-port" in sys.argv and rank == "0":
    # nothing listens on MASTER_PORT yet: the launcher picked a port that is free
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((env["MASTER_ADDR"], int(env["MASTER_PORT"])))
            facts["master_port_free"] = True
        except OSError as exc:
            facts["master_port_free"] = str(exc)
if "--torch" in sys.argv:
    # a real gloo rendezvous through the TCP store at node 0 the job was given
    import torch
    import torch.distributed as dist

    dist.init_process_group(env["BATCHYARD_DIST_BACKEND"],
                            init_method=env["AZ_BATCHAI_PYTORCH_INIT_METHOD"],
                            rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]))
    total = torch.tensor([int(env["RANK"]) + 1.0])
    dist.all_reduce(total)
    facts["allreduce"] = total.item()
    dist.destroy_process_group()
env["__facts__"] = facts
out = env["BATCHYARD_OUTPUT_MODEL"]
target = os.path.join(out, "env-%s.json" % rank)
with open(target + ".tmp", "w") as fh:
    json.dump(env, fh)
os.replace(target + ".tmp", target)
print("dumped", rank, "on", env.get("BATCHYARD_NODE_NAME"))
"""

ABORT = """\
import os, sys, time
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["RANK"]
print("rank", rank, "up", flush=True)
if rank == "3":
    time.sleep(1.0)
    os.abort()
time.sleep(120)
"""

JOBS: dict[str, dict[str, Any]] = {
    "pt": {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
           "command": "python dump.py --check-master-port --torch"},
    "mpi": {"nodes": 2, "distribution": {"type": "mpi", "processes_per_node": 2},
            "command": "python dump.py"},
    "tf": {"nodes": 2, "distribution": {"type": "tensorflow", "processes_per_node": 2,
                                        "parameter_server_count": 1},
           "command": "python dump.py"},
    "custom": {"nodes": 2, "distribution": {"type": "custom"}, "command": "python dump.py"},
    "usermpi": {"nodes": 2, "distribution": {"type": "custom", "processes_per_node": 2},
                "command": "mpirun -np 4 -hostfile $AZ_BATCHAI_MPI_HOST_FILE python dump.py"},
    "ptabort": {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
                "command": "python abort.py"},
    "mpiabort": {"nodes": 2, "distribution": {"type": "mpi", "processes_per_node": 2},
                 "command": "python abort.py"},
}


@pytest.fixture(scope="module")
def submitted(yard: Yard, cluster2: str) -> dict[str, str]:
    """Submit every job of the module at once; they queue on the 2-node cluster."""
    names = {}
    for key, body in JOBS.items():
        name = f"d-{key}"
        path = yard.write_job(name, {"name": name, "experiment": EXP, "code": ".",
                                     "outputs": {"MODEL": {}}, **body},
                              files={"dump.py": DUMP, "abort.py": ABORT})
        yard.ok("job", "create", "-f", str(path), "-c", cluster2)
        names[key] = name
    return names


def finished(yard: Yard, submitted: dict[str, str], key: str, state: str = "succeeded"
             ) -> dict[str, Any]:
    job = yard.wait_job(submitted[key], experiment=EXP, timeout=240)
    if job["state"] != state:
        logs = ""
        stdouterr = yard.attempt_dir(job) / "stdouterr"
        for path in sorted(stdouterr.glob("*.txt")):
            logs += f"--- {path.name}\n{path.read_text()[-2000:]}\n"
        raise AssertionError(f"job {job['name']}: {job['state']} ({job.get('message')}), "
                             f"expected {state}\n{logs}")
    return job


def dumps(yard: Yard, job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    folder = yard.attempt_dir(job) / "outputs" / "MODEL"
    return {p.name[len("env-"):-len(".json")]: json.loads(p.read_text())
            for p in sorted(folder.glob("env-*.json"))}


def test_pytorch_two_nodes(yard, submitted):
    job = finished(yard, submitted, "pt")
    ranks = dumps(yard, job)
    assert sorted(ranks) == ["0", "1", "2", "3"]
    ports = {e["MASTER_PORT"] for e in ranks.values()}
    assert len(ports) == 1, ports
    assert ranks["0"]["__facts__"]["master_port_free"] is True
    init = {e["AZ_BATCHAI_PYTORCH_INIT_METHOD"] for e in ranks.values()}
    assert len(init) == 1, init
    init_method = init.pop()
    # nodes share no disk: torch rendezvous over TCP at node 0's MASTER_ADDR:MASTER_PORT
    master = f"{ranks['0']['MASTER_ADDR']}:{ranks['0']['MASTER_PORT']}"
    assert init_method == f"tcp://{master}", init_method
    node_dirs = yard.node_attempt_dirs(job)
    for rank, env in ranks.items():  # each node's shared job temp is its own
        assert Path(env["AZ_BATCHAI_SHARED_JOB_TEMP"]) == node_dirs[int(rank) // 2] / "shared"
    for rank, env in ranks.items():
        assert env["BATCHYARD_DIST_BACKEND"] == "gloo"
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == str(int(rank) % 2)
        assert env["BATCHYARD_NODE_NAME"] == (NODE0 if int(rank) < 2 else NODE1)
        assert env["__facts__"]["allreduce"] == 1 + 2 + 3 + 4  # the gloo gang really met
        assert "AZ_BATCHAI_MPI_HOST_FILE" not in env and "TF_CONFIG" not in env
    yard.assert_no_process_left(job)


def test_mpi_two_nodes_by_two(yard, submitted):
    job = finished(yard, submitted, "mpi")
    ranks = dumps(yard, job)
    assert sorted(ranks) == ["0", "1", "2", "3"]
    attempt_dir = yard.attempt_dir(job)
    for rank, env in ranks.items():
        assert env["OMPI_COMM_WORLD_RANK"] == rank
        assert env["OMPI_COMM_WORLD_SIZE"] == "4"
        assert env["OMPI_COMM_WORLD_LOCAL_RANK"] == str(int(rank) % 2)
        assert env["OMPI_COMM_WORLD_LOCAL_SIZE"] == "2"
        # the rsh agent started the remote daemon inside its node's context
        node = NODE0 if int(rank) < 2 else NODE1
        assert env["BATCHYARD_NODE_NAME"] == node, rank
        assert env["BATCHYARD_NODE_RANK"] == str(int(rank) // 2)
        assert env["BATCHYARD_PROC_TAG"] == f"{job['attempts'][-1]['uuid']}/{int(rank) // 2}"
        assert env["__facts__"]["hostfile"] == f"{NODE0} slots=2\n{NODE1} slots=2\n"
        agent = env["OMPI_MCA_plm_rsh_agent"]
        assert agent and os.access(agent.split()[0], os.X_OK), agent
        assert "ssh" not in agent
        # per-rank logs named like every other distribution's
        log = attempt_dir / "stdouterr" / f"{node}-rank{rank}.stdout.txt"
        assert f"dumped {rank} on {node}" in log.read_text()
    # each node's directories are its own
    assert ranks["0"]["AZ_BATCHAI_JOB_MOUNT_ROOT"] != ranks["2"]["AZ_BATCHAI_JOB_MOUNT_ROOT"]
    # mpirun on node 0 only; every rank exited 0 (each rank's shim records it on its node)
    exits = {p.name: p.read_text().split() for d in yard.node_attempt_dirs(job)
             for p in (d / ".batchyard" / "mpi").glob("rank-*.exit")}
    assert exits == {f"rank-{r}.exit": ["0", NODE0 if r < 2 else NODE1] for r in range(4)}
    yard.assert_no_process_left(job)


def test_user_mpirun_in_custom_job(yard, submitted):
    """A custom job's command calls mpirun itself with $AZ_BATCHAI_MPI_HOST_FILE: the exported
    rsh agent reaches the other node without ssh."""
    job = finished(yard, submitted, "usermpi")
    ranks = dumps(yard, job)
    assert sorted(ranks) == ["0", "1", "2", "3"]
    for rank, env in ranks.items():
        assert env["OMPI_COMM_WORLD_SIZE"] == "4"
        assert env["BATCHYARD_NODE_NAME"] == (NODE0 if int(rank) < 2 else NODE1), rank
        assert env["__facts__"]["hostfile"] == f"{NODE0} slots=2\n{NODE1} slots=2\n"
    yard.assert_no_process_left(job)


def test_tensorflow_roles(yard, submitted):
    job = finished(yard, submitted, "tf")
    ranks = dumps(yard, job)
    assert sorted(ranks) == ["0", "1", "2", "3"]
    configs = {rank: json.loads(env["TF_CONFIG"]) for rank, env in ranks.items()}
    clusters = {json.dumps(c["cluster"], sort_keys=True) for c in configs.values()}
    assert len(clusters) == 1, clusters  # one cluster description for the whole gang
    cluster = configs["0"]["cluster"]
    assert sorted(cluster) == ["chief", "ps", "worker"]
    assert len(cluster["chief"]) == 1 and len(cluster["worker"]) == 2
    assert len(cluster["ps"]) == 1
    members = cluster["chief"] + cluster["worker"] + cluster["ps"]
    assert len(set(members)) == 4
    assert all(m.startswith("127.0.0.1:") for m in members)
    expected = {"0": ("chief", 0), "1": ("worker", 0), "2": ("worker", 1), "3": ("ps", 0)}
    for rank, env in ranks.items():
        task = configs[rank]["task"]
        assert (task["type"], task["index"]) == expected[rank], rank
        # each task's own address is the rank's node
        assert cluster[task["type"]][task["index"]] == members[int(rank)]
        assert env["AZ_BATCHAI_WORKER_HOSTS"] == ",".join(cluster["chief"] + cluster["worker"])
        assert env["AZ_BATCHAI_PS_HOSTS"] == cluster["ps"][0]
        assert env["AZ_BATCHAI_TASK_TYPE"] == task["type"]
        assert env["BATCHYARD_NODE_NAME"] == (NODE0 if int(rank) < 2 else NODE1)
    # Batch AI numbers workers with the master as worker 0
    assert [ranks[r]["AZ_BATCHAI_TASK_INDEX"] for r in "0123"] == ["0", "1", "2", "0"]
    yard.assert_no_process_left(job)


def test_custom_runs_once_on_node_zero(yard, submitted):
    job = finished(yard, submitted, "custom")
    ranks = dumps(yard, job)
    assert list(ranks) == ["0"], list(ranks)  # one process: RANK 0 of a world of 1
    env = ranks["0"]
    assert env["WORLD_SIZE"] == "1"
    assert env["BATCHYARD_NODE_NAME"] == NODE0 and env["BATCHYARD_NODE_RANK"] == "0"
    assert env["BATCHYARD_NUM_NODES"] == "2"
    logs = sorted(p.name for p in (yard.attempt_dir(job) / "stdouterr").glob("*rank*"))
    assert logs == [f"{NODE0}-rank0.stderr.txt", f"{NODE0}-rank0.stdout.txt"], logs
    yard.assert_no_process_left(job)


@pytest.mark.parametrize("key,label", [("ptabort", "rank 3 on node local2-1"),
                                       ("mpiabort", "MPI rank 3 on node local2-1")])
def test_aborting_rank_takes_the_gang_down(yard, submitted, key, label):
    job = finished(yard, submitted, key, state="failed")
    message = job.get("message") or ""
    assert label in message and "134" in message, message
    attempt = job["attempts"][-1]
    assert attempt["state"] == "failed"
    # the gang went down at once, not at the 120 s sleep of the other ranks
    status = yard.node_reports(job)  # as the launchers reported them
    assert len(status) == 2 and all(s["state"] in ("failed", "aborted") for s in status)
    took = max(s["ended_at"] for s in status) - min(s["started_at"] for s in status)
    assert took < 60, took
    yard.assert_no_process_left(job)


BATCHAI_PATHS = {
    "$schema": "https://raw.githubusercontent.com/Azure/BatchAI/master/schemas/2018-05-01/"
               "job.json",
    "properties": {
        "nodeCount": 2,
        "customToolkitSettings": {
            "commandLine": "python $AZ_BATCHAI_JOB_MOUNT_ROOT/share/dump.py "
                           "$AZ_BATCHAI_OUTPUT_MODEL && echo model at $AZ_BATCHAI_OUTPUT_MODEL"},
        "stdOutErrPathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share/logs",
        "mountVolumes": {"azureFileShares": [
            {"azureFileUrl": "file://./share", "relativeMountPath": "share"}]},
        "outputDirectories": [{"id": "MODEL", "pathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share",
                               "pathSuffix": "models"}],
    },
}


def test_batchai_path_expansion(yard, cluster2, submitted):
    """stdOutErrPathPrefix and outputDirectories' pathPrefix under $AZ_BATCHAI_JOB_MOUNT_ROOT
    land in the mounted (here: local) share, as on Batch AI."""
    folder = yard.work / "jobs" / "bai-paths"
    share = folder / "share"
    share.mkdir(parents=True)
    (share / "dump.py").write_text(DUMP)
    path = folder / "job.json"
    path.write_text(json.dumps(BATCHAI_PATHS, indent=2))
    run = yard.cli("job", "create", "-f", str(path), "-n", "bai-paths", "-e", EXP,
                   "-c", cluster2, "--wait", timeout=240)
    assert run.rc == 0, str(run)
    job = yard.js("job", "show", "-n", "bai-paths", "-e", EXP)
    assert job["state"] == "succeeded"
    suffix = Path("default", EXP, "bai-paths", job["attempts"][-1]["uuid"])
    model = share / suffix / "outputs" / "MODEL" / "models"  # the id as spelled
    dumped = json.loads((model / "env-0.json").read_text())
    assert dumped["__facts__"]["argv"] == [str(Path(dumped["AZ_BATCHAI_OUTPUT_MODEL"]))]
    assert Path(dumped["AZ_BATCHAI_OUTPUT_MODEL"]).resolve() == model.resolve()
    assert "$" not in dumped["AZ_BATCHAI_STDOUTERR_DIR"]
    stdouterr = share / "logs" / suffix / "stdouterr"
    assert Path(dumped["AZ_BATCHAI_STDOUTERR_DIR"]).resolve() == stdouterr.resolve()
    text = (stdouterr / f"{NODE0}-rank0.stdout.txt").read_text()
    assert "model at " in text and "$AZ_BATCHAI" not in text
    assert "dumped 0 on local2-0" in text


BATCHAI_TEMP = {
    "properties": {
        "nodeCount": 2,
        "pyTorchSettings": {
            "pythonScriptFilePath": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share/dump.py",
            "pythonInterpreterPath": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share/bin/python",
            "processCount": 2},
        "stdOutErrPathPrefix": "$AZ_BATCHAI_JOB_TEMP",
        "mountVolumes": {"azureFileShares": [
            {"azureFileUrl": "file://./share", "relativeMountPath": "share"}]},
        "outputDirectories": [{"id": "MODEL", "pathPrefix": "${AZ_BATCHAI_JOB_TEMP}/out"}],
    },
}


def test_batchai_paths_under_the_job_temp(yard, cluster2, submitted):
    """Every path property expands Batch AI's variables on the node, as Batch AI did:
    stdOutErrPathPrefix $AZ_BATCHAI_JOB_TEMP, a pathPrefix ${AZ_BATCHAI_JOB_TEMP}/out and a
    pythonInterpreterPath under $AZ_BATCHAI_JOB_MOUNT_ROOT (the job's `python`)."""
    folder = yard.work / "jobs" / "bai-temp"
    share = folder / "share"
    (share / "bin").mkdir(parents=True)
    (share / "dump.py").write_text(DUMP)
    (share / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    path = folder / "job.json"
    path.write_text(json.dumps(BATCHAI_TEMP, indent=2))
    run = yard.cli("job", "create", "-f", str(path), "-n", "bai-temp", "-e", EXP,
                   "-c", cluster2, "--wait", timeout=240)
    assert run.rc == 0, str(run)
    job = yard.js("job", "show", "-n", "bai-temp", "-e", EXP)
    attempt = job["attempts"][-1]
    suffix = Path("default", EXP, "bai-temp", attempt["uuid"])
    for rank, node in enumerate(n["node"] for n in attempt["nodes"]):
        temp = yard.node_dir(job, node) / "jobs" / f"bai-temp-{attempt['uuid'][:8]}" / "tmp"
        env = json.loads((temp / "out" / suffix / "outputs" / "MODEL" / f"env-{rank}.json")
                         .read_text())
        assert env["AZ_BATCHAI_JOB_TEMP"] == str(temp), env
        assert env["AZ_BATCHAI_STDOUTERR_DIR"] == str(temp / suffix / "stdouterr"), env
        assert (temp / suffix / "stdouterr" / f"{node}-rank{rank}.stdout.txt").is_file()
        assert env["__facts__"]["executable"] == str(
            Path(env["AZ_BATCHAI_JOB_MOUNT_ROOT"]) / "share" / "bin" / "python"), env
    logs = yard.ok("job", "logs", "-n", "bai-temp", "-e", EXP).stdout
    assert "dumped 0 on local2-0" in logs and "dumped 1 on local2-1" in logs, logs
