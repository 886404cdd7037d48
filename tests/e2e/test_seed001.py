"""Seed 001 end to end: the notebook's code cells (examples/azureml-seed001/seed001.py, only
the imports changed) run as a script in a fresh home with no server running — the SDK starts
the local one — creating the workspace, a max_nodes=2 compute target and the experiment, and
training a PyTorch estimator on 2 nodes with distributed_backend='mpi'. Then the run is read
back through the compat API: it completed, and the accuracy it logged from inside the job is
above 0.9."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import strictkit
from yardkit import Yard

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "azureml-seed001"

pytestmark = [
    pytest.mark.timeout(300), pytest.mark.mpi, pytest.mark.torch,
    strictkit.requires(shutil.which("mpirun") is None, "needs Open MPI (mpirun)"),
    strictkit.requires(importlib.util.find_spec("mpi4py") is None, "needs mpi4py"),
    strictkit.requires(importlib.util.find_spec("torch") is None, "needs PyTorch"),
]


@pytest.fixture
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    """A home with no server: the seed script's first SDK call starts one."""
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("notebook"))
    try:
        yield y
    finally:
        y.stop()


def test_seed_001_notebook_runs_with_only_imports_changed(fresh: Yard,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    notebook = fresh.work
    for name in ("seed001.py", "pytorch_horovod_mnist.py"):
        shutil.copy(EXAMPLE / name, notebook / name)
    proc = subprocess.run([sys.executable, "seed001.py"], cwd=notebook, env=fresh.env,
                          capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
    assert "Started a local batchyard server" in err
    assert "SDK version: 1.0.2+batchyard" in out
    assert "Found the config file in" in out
    assert "Creating a new compute target..." in out and "Succeeded" in out
    assert "'maxNodeCount': 2" in out and "'vmPriority': 'LowPriority'" in out
    assert "Run(Experiment: pytorch-distr-hvd" in out
    # every rank's log, streamed by wait_for_completion(show_output=True)
    assert "[gpucluster-0/rank0] MPI world size 2" in out
    assert "Train Epoch: 10" in out and "Test set: Accuracy" in out
    assert "Execution Summary" in out
    assert (notebook / "aml_config" / "config.json").is_file()
    assert (notebook / "pytorch-distr-hvd" / "pytorch_horovod_mnist.py").is_file()

    # read the run back like a user would in the next notebook cell
    from batchyard.compat.azureml.core import Experiment
    from batchyard.compat.azureml.core.workspace import Workspace
    from batchyard.sdk import set_default_client

    monkeypatch.setenv("BATCHYARD_HOME", str(fresh.home))
    for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN", "BATCHYARD_API"):
        monkeypatch.delenv(key, raising=False)
    set_default_client(None)
    try:
        ws = Workspace.from_config(path=str(notebook))
        assert (ws.name, ws.resource_group) == ("seed-workspace", "seed-resource-group")
        runs = list(Experiment(ws, "pytorch-distr-hvd").get_runs())
        assert len(runs) == 1
        run = runs[0]
        assert run.get_status() == "Completed"
        details = run.get_details()
        assert details["runDefinition"]["communicator"] == "Mpi"
        assert details["runDefinition"]["nodeCount"] == 2
        metrics = run.get_metrics()
        assert metrics["accuracy"] > 0.9, metrics
        assert len(metrics["loss"]) == 10 and metrics["loss"][-1] < metrics["loss"][0]
        assert "outputs/model.pt" in run.get_file_names()
        saved = run.download_file("outputs/model.pt", str(notebook / "model.pt"))
        assert Path(saved).stat().st_size > 1000
        job = run.job.refresh()
        assert job["distribution"] == "mpi" and job["nodes"] == 2
    finally:
        set_default_client(None)
