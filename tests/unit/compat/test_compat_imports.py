"""Every azureml name the seeds and the samples of that era use is importable from the
mirrored module path, and the package-level access the notebooks use works."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

NAMES = {
    "core": ["VERSION", "Workspace", "Experiment", "Run", "ScriptRunConfig", "Environment",
             "Datastore", "ComputeTarget", "RunConfiguration", "CondaDependencies"],
    "core.workspace": ["Workspace"],
    "core.compute": ["ComputeTarget", "AmlCompute", "AmlComputeProvisioningConfiguration",
                     "AmlComputeStatus"],
    "core.compute_target": ["ComputeTargetException", "ComputeTarget"],
    "core.runconfig": ["MpiConfiguration", "PyTorchConfiguration", "TensorflowConfiguration",
                       "RunConfiguration", "DockerConfiguration"],
    "core.run": ["Run"],
    "core.experiment": ["Experiment"],
    "core.script_run_config": ["ScriptRunConfig"],
    "core.environment": ["Environment"],
    "core.conda_dependencies": ["CondaDependencies"],
    "core.datastore": ["Datastore"],
    "data.data_reference": ["DataReference"],
    "train.estimator": ["Estimator"],
    "train.dnn": ["PyTorch", "TensorFlow", "Chainer", "Mpi", "Gloo", "Nccl", "ParameterServer"],
    "widgets": ["RunDetails"],
    "telemetry": ["set_diagnostics_collection"],
    "exceptions": ["ComputeTargetException", "UserErrorException", "ActivityFailedException",
                   "UnsupportedParameterError", "WorkspaceException", "ProjectSystemException",
                   "ExperimentExecutionException", "RunEnvironmentException",
                   "AzureMLException", "TrainingException"],
}


@pytest.mark.parametrize("module", sorted(NAMES))
def test_names_importable(module: str) -> None:
    mod = importlib.import_module(f"batchyard.compat.azureml.{module}")
    for name in NAMES[module]:
        assert getattr(mod, name) is not None, f"{module}.{name}"


def test_seed_cells_first_lines() -> None:
    from batchyard.compat import azureml

    assert azureml.core.VERSION.startswith("1.0.2+batchyard")
    from batchyard.compat.azureml.core.compute import AmlCompute, ComputeTarget
    from batchyard.compat.azureml.core.compute_target import ComputeTargetException

    assert issubclass(AmlCompute, ComputeTarget)
    assert issubclass(ComputeTargetException, Exception)


def test_compute_target_exception_is_the_same_class_everywhere() -> None:
    from batchyard.compat.azureml.core.compute_target import ComputeTargetException as A
    from batchyard.compat.azureml.exceptions import ComputeTargetException as B

    assert A is B


def test_a_rank_importing_run_does_not_load_the_server_or_the_cli() -> None:
    code = ("import sys; from batchyard.compat.azureml.core.run import Run; "
            "print(sorted(m for m in sys.modules if m.startswith(('fastapi', 'typer', "
            "'sqlalchemy', 'batchyard.server', 'batchyard.cli.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_telemetry_records_the_choice_and_sends_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    from batchyard.compat.azureml.telemetry import (
        get_diagnostics_collection_info,
        set_diagnostics_collection,
    )

    set_diagnostics_collection(send_diagnostics=True)
    assert get_diagnostics_collection_info()["send_diagnostics"] is True
    assert "sends no diagnostics" in capsys.readouterr().out
    set_diagnostics_collection(send_diagnostics=False, verbose=False)
    assert get_diagnostics_collection_info()["send_diagnostics"] is False
