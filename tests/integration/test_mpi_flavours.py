"""MPI jobs under Hydra-based MPIs on a real 2-node local cluster, through the batchyard rsh
relay and never ssh: examples/mnist-mpi (2 nodes x 4 ranks) under MPICH (PyPI's ``mpich`` in
the job's ``environment.python`` venv, flavour given) trains to ``succeeded`` with every
rank's own log files; a failing rank is named under MPICH (flavour detected from the venv's
``mpirun --version``); a Batch AI job.json's horovodSettings runs under MPICH; a user's own
``mpirun -f $AZ_BATCHAI_MPI_HOST_FILE`` in a custom job reaches the other node, every rank
keeping its own node's environment; batchyard's line and a user's own under Intel MPI
(PyPI's ``impi-rt``, whose mpiexec.hydra runs here). Open MPI's jobs are in
test_distributions.py and tests/e2e/test_examples.py.

ssh is on this host, so every module's server (and so every launcher and rank) finds a
tripwire ``ssh`` first on its PATH that records being called: Hydra's default launcher, or a
relay bypassed, would run it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpikit import mpi_venv
from yardkit import CLUSTER, Yard

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NODE0, NODE1 = f"{CLUSTER}-0", f"{CLUSTER}-1"

# Each rank dumps its environment as JSON into the MODEL output, named by its MPI rank.
DUMP = """\
import json, os
env = dict(os.environ)
rank = env.get("PMI_RANK") or env.get("OMPI_COMM_WORLD_RANK") or "single"
from mpi4py import MPI
comm = MPI.COMM_WORLD
env["__facts__"] = {"size": comm.size, "rank": comm.rank, "sum": comm.allreduce(comm.rank),
                    "library": MPI.Get_library_version().splitlines()[0]}
out = env["BATCHYARD_OUTPUT_MODEL"]
with open(os.path.join(out, "env-%s.json" % rank + ".tmp"), "w") as fh:
    json.dump(env, fh)
os.replace(os.path.join(out, "env-%s.json" % rank + ".tmp"),
           os.path.join(out, "env-%s.json" % rank))
print("dumped", rank, "on", env["BATCHYARD_NODE_NAME"], flush=True)
"""

# Rank 3 fails: aborts (SIGABRT, no MPI_Finalize), or exits 3 after MPI_Finalize (mpi4py
# finalizes at exit); the others wait SLEEP seconds, so a gang that went down at once shows.
FAIL = """\
import os, sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.rank
assert str(rank) == os.environ["PMI_RANK"]
print("rank", rank, "up", flush=True)
if rank == 3:
    time.sleep(1.0)
    os.abort() if sys.argv[1] == "abort" else sys.exit(3)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    """A server whose PATH starts with a tripwire ``ssh``."""
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    trip = y.work / "tripwire"
    trip.mkdir()
    (trip / "ssh").write_text(f'#!/bin/sh\necho "$@" >> {trip}/ssh-called\nexit 255\n')
    (trip / "ssh").chmod(0o755)
    y.env["PATH"] = f"{trip}:{y.env.get('PATH', '/usr/bin:/bin')}"
    try:
        y.start_server()
        yield y
    finally:
        y.stop()


@pytest.fixture(scope="module")
def cluster(yard: Yard) -> str:
    """2 nodes x 4 vCPU: room for the MPI example's 4 ranks per node."""
    yard.ok("cluster", "create", "-n", CLUSTER, "--cpus", "4", "-t", "2")
    yard.wait_cluster(CLUSTER, 2)
    return CLUSTER


def no_ssh(yard: Yard) -> None:
    called = yard.work / "tripwire" / "ssh-called"
    assert not called.exists(), f"ssh was called: {called.read_text()}"


def run(yard: Yard, job_file: Path, name: str, state: str = "succeeded",
        timeout: float = 400) -> dict[str, Any]:
    yard.ok("job", "create", "-f", str(job_file), "-n", name, "-c", CLUSTER, timeout=120)
    job = yard.wait_job(name, timeout=timeout)
    if job["state"] != state:
        folder = yard.attempt_dir(job) / "stdouterr"
        logs = "".join(f"--- {p.name}\n{p.read_text()[-2000:]}\n"
                       for p in sorted(folder.glob("*.txt")))
        raise AssertionError(f"{name}: {job['state']} ({job.get('message')}), expected "
                             f"{state}\n{logs}")
    return job


def relayed_execs(yard: Yard, job: dict[str, Any]) -> dict[str, int]:
    """What node 1's launcher ran for node 0's mpiexec through the relay (exec id -> exit
    code), from its status file on its own disk (the API does not show them)."""
    status = yard.node_attempt_dirs(job)[1] / ".batchyard" / "node-1.status.json"
    execs: dict[str, int] = json.loads(status.read_text()).get("execs") or {}
    return execs


def hostfile(yard: Yard, job: dict[str, Any]) -> str:
    return (yard.node_attempt_dirs(job)[0] / ".batchyard" / "hostfile").read_text()


def dumps(yard: Yard, job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    folder = yard.attempt_dir(job) / "outputs" / "MODEL"
    return {p.name[len("env-"):-len(".json")]: json.loads(p.read_text())
            for p in sorted(folder.glob("env-*.json"))}


def test_mnist_mpi_example_under_mpich(yard: Yard, cluster: str) -> None:
    venv = mpi_venv("mpich")
    folder = yard.work / "examples" / "mnist-mpi"
    shutil.copytree(EXAMPLES / "mnist-mpi", folder,
                    ignore=shutil.ignore_patterns("outputs", "__pycache__", "*.pyc"))
    # jobprep.sh's `mpirun --version | head -n 1` under `set -o pipefail` fails with SIGPIPE
    # (141) when mpirun prints more than head reads, as MPICH's does: until the example's
    # script reads the whole output, its copy here does (a no-op once it does)
    prep = folder / "jobprep.sh"
    prep.write_text(prep.read_text().replace("2>&1 | head -n 1", "2>&1 | sed -n 1p"))
    spec = yaml.safe_load((folder / "job.yaml").read_text())  # as it is: 2 nodes x 4 ranks
    spec["environment"] = {"python": str(venv / "bin" / "python")}
    spec["mpi"] = {"flavour": "mpich"}
    job_file = folder / "job-mpich.yaml"
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    job = run(yard, job_file, "mnist-mpich")
    logs = yard.attempt_dir(job) / "stdouterr"
    for rank in range(8):  # each rank's own log, on its own node
        node = NODE0 if rank < 4 else NODE1
        assert (logs / f"{node}-rank{rank}.stdout.txt").is_file(), sorted(logs.iterdir())
    rank0 = (logs / f"{NODE0}-rank0.stdout.txt").read_text()
    assert "MPI world size 8 (MPICH" in rank0, rank0
    assert "test accuracy: 0.9" in rank0, rank0
    for node in (NODE0, NODE1):  # jobprep found MPICH's mpirun on both nodes
        prep = (logs / f"{node}-prepare.stdout.txt").read_text()
        assert "HYDRA build details" in prep and "jobprep done" in prep, prep
    assert (yard.attempt_dir(job) / "outputs" / "MODEL" / "model.npz").is_file()
    assert hostfile(yard, job) == f"{NODE0}:4\n{NODE1}:4\n"
    exits = {p.name: p.read_text().split() for d in yard.node_attempt_dirs(job)
             for p in (d / ".batchyard" / "mpi").glob("rank-*.exit")}
    assert exits == {f"rank-{r}.exit": ["0", NODE0 if r < 4 else NODE1] for r in range(8)}
    execs = relayed_execs(yard, job)
    assert execs and set(execs.values()) == {0}, execs  # node 1's proxy came by the relay
    no_ssh(yard)
    yard.assert_no_process_left(job)


def _dump_job(yard: Yard, name: str, flavour: str, command: str, kind: str = "mpi") -> Path:
    venv = mpi_venv(flavour)
    return yard.write_job(name, {
        "name": name, "nodes": 2, "code": ".", "outputs": {"MODEL": {}},
        "distribution": {"type": kind, "processes_per_node": 2},
        "environment": {"python": str(venv / "bin" / "python")},
        "command": command}, files={"dump.py": DUMP, "fail.py": FAIL})


def _assert_each_node_its_own(ranks: dict[str, dict[str, Any]], library: str) -> None:
    assert sorted(ranks) == ["0", "1", "2", "3"], sorted(ranks)
    for rank, env in ranks.items():
        node = NODE0 if int(rank) < 2 else NODE1
        facts = env["__facts__"]
        assert facts["size"] == 4 and facts["sum"] == 6 and str(facts["rank"]) == rank
        assert facts["library"].startswith(library), facts
        # the rank kept its own node's environment, not mpiexec's (node 0's)
        assert env["BATCHYARD_NODE_NAME"] == node, (rank, env["BATCHYARD_NODE_NAME"])
        assert env["BATCHYARD_NODE_RANK"] == str(int(rank) // 2)
        assert env["BATCHYARD_PROC_TAG"].endswith(f"/{int(rank) // 2}")


@pytest.mark.parametrize("how,code,sleep", [("abort", 134, 120), ("exit", 3, 5)])
def test_failing_rank_is_named_under_mpich(yard: Yard, cluster: str, how: str, code: int,
                                           sleep: int) -> None:
    """No flavour given: the launcher finds MPICH in the job's venv (`mpirun --version`). An
    aborting rank takes the gang down at once; one that exits non-zero after MPI_Finalize is
    named when the others end (Hydra does not stop them)."""
    name = f"fail-mpich-{how}"
    job_file = _dump_job(yard, name, "mpich", f"python fail.py {how} {sleep}")
    job = run(yard, job_file, name, state="failed")
    message = job.get("message") or ""
    assert f"MPI rank 3 on node {NODE1} exited with code {code}" in message, message
    assert hostfile(yard, job) == f"{NODE0}:2\n{NODE1}:2\n"  # detected: Hydra's format
    status = yard.node_reports(job)
    took = max(s["ended_at"] for s in status) - min(s["started_at"] for s in status)
    assert took < 60, took
    no_ssh(yard)
    yard.assert_no_process_left(job)


@pytest.mark.parametrize("flavour,library", [("mpich", "MPICH"),
                                             ("intelmpi", "Intel(R) MPI")])
def test_users_own_mpirun_in_a_custom_job(yard: Yard, cluster: str, flavour: str,
                                          library: str) -> None:
    """customMpiSettings' shape: the command runs mpirun itself with the hostfile. Intel
    MPI's environment propagation has no variable to turn it off, so its line says
    -genvnone (batchyard's own line always does)."""
    extra = " -genvnone" if flavour == "intelmpi" else ""
    job_file = _dump_job(yard, f"user-{flavour}", flavour,
                         f"mpirun{extra} -n 4 -f $AZ_BATCHAI_MPI_HOST_FILE python dump.py",
                         kind="custom")
    job = run(yard, job_file, f"user-{flavour}")
    _assert_each_node_its_own(dumps(yard, job), library)
    assert relayed_execs(yard, job), "nothing came to node 1 by the relay"
    no_ssh(yard)
    yard.assert_no_process_left(job)


def test_batchai_horovod_settings_under_mpich(yard: Yard, cluster: str) -> None:
    """A Batch AI job.json, as is: horovodSettings whose pythonInterpreterPath is a venv
    with MPICH runs under MPICH (detected), 2 ranks per node through the relay."""
    venv = mpi_venv("mpich")
    folder = yard.work / "jobs" / "bai-horovod"
    (folder / "share").mkdir(parents=True)
    (folder / "share" / "dump.py").write_text(DUMP)
    (folder / "job.json").write_text(json.dumps({
        "$schema": "https://raw.githubusercontent.com/Azure/BatchAI/master/schemas/"
                   "2018-05-01/job.json",
        "properties": {
            "nodeCount": 2,
            "horovodSettings": {
                "pythonScriptFilePath": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share/dump.py",
                "pythonInterpreterPath": str(venv / "bin" / "python"), "processCount": 4},
            "mountVolumes": {"azureFileShares": [
                {"azureFileUrl": "file://./share", "relativeMountPath": "share"}]},
            "outputDirectories": [{"id": "MODEL",
                                   "pathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share"}]}}))
    job = run(yard, folder / "job.json", "bai-horovod")
    suffix = Path("default", "default", "bai-horovod", job["attempts"][-1]["uuid"])
    model = folder / "share" / suffix / "outputs" / "MODEL"  # the id as spelled
    ranks = {p.name[len("env-"):-len(".json")]: json.loads(p.read_text())
             for p in sorted(model.glob("env-*.json"))}
    _assert_each_node_its_own(ranks, "MPICH")
    assert hostfile(yard, job) == f"{NODE0}:2\n{NODE1}:2\n"
    no_ssh(yard)
    yard.assert_no_process_left(job)


def test_intel_mpi_job(yard: Yard, cluster: str) -> None:
    """batchyard's own line under Intel MPI (flavour detected), rank logs per node."""
    job_file = _dump_job(yard, "impi", "intelmpi", "python dump.py")
    job = run(yard, job_file, "impi")
    _assert_each_node_its_own(dumps(yard, job), "Intel(R) MPI")
    logs = yard.attempt_dir(job) / "stdouterr"
    for rank in range(4):
        node = NODE0 if rank < 2 else NODE1
        text = (logs / f"{node}-rank{rank}.stdout.txt").read_text()
        assert f"dumped {rank} on {node}" in text, text
    assert hostfile(yard, job) == f"{NODE0}:2\n{NODE1}:2\n"
    no_ssh(yard)
    yard.assert_no_process_left(job)
