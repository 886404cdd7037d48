"""What ``python``/``python3``/``pip`` and ``azureml`` mean inside a job, through real jobs on a
real 2-node local cluster: the job's interpreter on every rank of every distribution (MPI
ranks started by the remote daemons included: Open MPI's mpirun, called by its absolute path,
puts its own ``bin`` first on the remote ranks' PATH), an AML training script's own
``from azureml.core.run import Run`` (batchyard's compat, through a shim on the ranks'
PYTHONPATH only), and a Batch AI ``cntkSettings`` BrainScript job run as ``cntk configFile=``
under mpirun.

All jobs are submitted up front; they queue on the one cluster and each test waits for its own.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from yardkit import CLUSTER, Yard

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]

EXP = "interp"
NODE0, NODE1 = "local2-0", "local2-1"

# mpi4py's demo/helloworld.py, plus the facts the test checks.
HELLO = """\
import json, os, sys
from mpi4py import MPI

comm = MPI.COMM_WORLD
print("Hello, World! I am process %d of %d on %s." % (comm.Get_rank(), comm.Get_size(),
                                                      MPI.Get_processor_name()))
print("facts " + json.dumps({"rank": comm.Get_rank(), "size": comm.Get_size(),
                             "prefix": sys.prefix,
                             "node": os.environ["BATCHYARD_NODE_NAME"]}), flush=True)
"""

CHECK = """\
import json, os, shutil, sys
rank = os.environ.get("RANK", "0")
print("facts " + json.dumps({"rank": rank, "prefix": sys.prefix,
                             "pip": shutil.which("pip"), "temp": os.environ["AZ_BATCHAI_JOB_TEMP"],
                             "node": os.environ["BATCHYARD_NODE_NAME"]}), flush=True)
"""

# Seed 001's kind of training script, unchanged: its own azureml imports.
AML_TRAIN = """\
from azureml.core.run import Run
from azureml.core import Run as CoreRun
import azureml.core

assert Run is CoreRun
run = Run.get_context()
run.log("acc", 0.9)
print("azureml", azureml.core.VERSION, flush=True)
"""

# A stand-in for the CNTK binary (no CNTK build exists for this Python): it reads the
# BrainScript config it was given and says which MPI rank ran it with what.
CNTK = """\
#!/bin/sh
case "$1" in configFile=*) ;; *) echo "cntk: no configFile= first" >&2; exit 2;; esac
cfg="${1#configFile=}"
test -f "$cfg" || { echo "cntk: $cfg not found" >&2; exit 3; }
rank="${OMPI_COMM_WORLD_RANK:-?}"
echo "cntk rank $rank of ${OMPI_COMM_WORLD_SIZE:-?}: $* command=$(head -1 "$cfg")"
"""


def _bai(block: str, settings: dict[str, Any]) -> dict[str, Any]:
    return {"properties": {
        "nodeCount": 2, block: settings,
        "stdOutErrPathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share/logs",
        "mountVolumes": {"azureFileShares": [
            {"azureFileUrl": "file://./share", "relativeMountPath": "share"}]},
        "outputDirectories": [{"id": "MODEL", "pathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share"}],
    }}


BATCHAI_JOBS = {
    "bai-mpi3": _bai("customMpiSettings", {
        "commandLine": "python3 $AZ_BATCHAI_JOB_MOUNT_ROOT/share/hello.py", "processCount": 4}),
    "bai-cntk": _bai("cntkSettings", {
        "configFilePath": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share/ConvNet_MNIST.cntk",
        "commandLineArgs": "rootDir=. OutputDir=$AZ_BATCHAI_OUTPUT_MODEL", "processCount": 4}),
}
NATIVE_JOBS: dict[str, dict[str, Any]] = {
    "pt3": {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
            "command": "python3 check.py && pip --version"},
    "custom3": {"nodes": 2, "distribution": {"type": "custom"},
                "command": "python3 check.py && pip --version"},
    "aml": {"nodes": 1, "command": "python3 train.py"},
}


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    """A server whose PATH has the ``cntk`` stand-in (as a CNTK image's PATH would)."""
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    tools = y.work / "cntk-bin"
    tools.mkdir()
    (tools / "cntk").write_text(CNTK)
    (tools / "cntk").chmod(0o755)
    y.env["PATH"] = f"{tools}:{y.env.get('PATH', '/usr/bin:/bin')}"
    try:
        y.start_server()
        yield y
    finally:
        y.stop()


@pytest.fixture(scope="module")
def submitted(yard: Yard) -> dict[str, str]:
    yard.ok("cluster", "create", "-n", CLUSTER, "-s", "Standard_D2_v2", "-t", "2")
    yard.wait_cluster(CLUSTER, 2)
    for name, body in BATCHAI_JOBS.items():
        folder = yard.work / "jobs" / name
        (folder / "share").mkdir(parents=True)
        (folder / "share" / "hello.py").write_text(HELLO)
        (folder / "share" / "ConvNet_MNIST.cntk").write_text("command = trainNetwork\n")
        (folder / "job.json").write_text(json.dumps(body))
        yard.ok("job", "create", "-f", str(folder / "job.json"), "-n", name, "-e", EXP,
                "-c", CLUSTER)
    for name, body in NATIVE_JOBS.items():
        path = yard.write_job(name, {"name": name, "experiment": EXP, "code": ".", **body},
                              files={"check.py": CHECK, "train.py": AML_TRAIN})
        yard.ok("job", "create", "-f", str(path), "-c", CLUSTER)
    return {name: name for name in [*BATCHAI_JOBS, *NATIVE_JOBS]}


def _logs(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.rglob("*.txt"))}


def _finished(yard: Yard, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    job = yard.wait_job(name, experiment=EXP, timeout=300)
    share = yard.work / "jobs" / name / "share" / "logs"
    logs = _logs(share if share.is_dir() else yard.attempt_dir(job) / "stdouterr")
    assert job["state"] == "succeeded", (job.get("message"), logs)
    return job, logs


def _facts(logs: dict[str, str]) -> list[dict[str, Any]]:
    return [json.loads(line[len("facts "):]) for text in logs.values()
            for line in text.splitlines() if line.startswith("facts ")]


def test_python3_in_a_batchai_mpi_job_is_the_jobs_interpreter(yard, submitted):
    """customMpiSettings ``python3 hello.py`` (mpi4py), 2 nodes x 2: every rank imports mpi4py
    from the job's environment and joins one MPI world of 4."""
    job, logs = _finished(yard, submitted["bai-mpi3"])
    facts = sorted(_facts(logs), key=lambda f: f["rank"])
    assert [f["rank"] for f in facts] == [0, 1, 2, 3], logs
    assert {f["size"] for f in facts} == {4}
    assert {f["prefix"] for f in facts} == {sys.prefix}
    assert [f["node"] for f in facts] == [NODE0, NODE0, NODE1, NODE1]
    text = "".join(logs.values())
    assert text.count("Hello, World! I am process") == 4
    assert "No module named" not in text
    yard.assert_no_process_left(job)


@pytest.mark.parametrize("key", ["pt3", "custom3"])
def test_python3_and_pip_in_other_distributions(yard, submitted, key):
    _job, logs = _finished(yard, submitted[key])
    facts = _facts(logs)
    assert len(facts) == (4 if key == "pt3" else 1), logs
    assert {f["prefix"] for f in facts} == {sys.prefix}
    # `pip` is the job's interpreter's pip, whatever the host's PATH holds
    pips = [line for text in logs.values() for line in text.splitlines()
            if line.startswith("pip ")]
    assert len(pips) == len(facts) and all(f" from {sys.prefix}/" in p for p in pips), pips
    assert all(f["pip"] == f"{f['temp']}/bin/pip" for f in facts), facts


def test_aml_training_script_imports_work_unchanged(yard, submitted):
    """``from azureml.core.run import Run`` in the job resolves to batchyard's compat; the
    metric it logs shows in ``job metrics``. Outside the job there is no ``azureml``."""
    _job, logs = _finished(yard, submitted["aml"])
    assert any("azureml 1.0.2+batchyard" in text for text in logs.values()), logs
    rows = yard.js("job", "metrics", "-n", "aml", "-e", EXP)
    assert [(r["name"], r["value"]) for r in rows] == [("acc", 0.9)]
    assert "acc" in yard.ok("job", "metrics", "-n", "aml", "-e", EXP).stdout
    assert importlib.util.find_spec("azureml") is None  # never installed globally


def test_cntk_brainscript_runs_cntk_config_file_under_mpirun(yard, submitted):
    """cntkSettings.configFilePath: ``cntk configFile=<cfg> <commandLineArgs>`` on 4 MPI
    ranks over the 2 nodes, its $AZ_BATCHAI_* expanded by the node's shell."""
    _job, logs = _finished(yard, submitted["bai-cntk"])
    shown = yard.js("job", "show", "-n", "bai-cntk", "-e", EXP)
    assert shown["spec"]["command"] == ("cntk configFile=$AZ_BATCHAI_JOB_MOUNT_ROOT/share/"
                                        "ConvNet_MNIST.cntk rootDir=. "
                                        "OutputDir=$AZ_BATCHAI_OUTPUT_MODEL")
    assert shown["spec"]["distribution"]["type"] == "mpi"
    lines = sorted(line for text in logs.values() for line in text.splitlines()
                   if line.startswith("cntk rank"))
    assert [line.split(":")[0] for line in lines] == [f"cntk rank {r} of 4" for r in range(4)]
    for line in lines:
        assert "configFile=/" in line and "ConvNet_MNIST.cntk rootDir=. OutputDir=/" in line
        assert "command=command = trainNetwork" in line and "$AZ_BATCHAI" not in line
