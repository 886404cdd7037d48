"""Estimators and ScriptRunConfig -> batchyard job specs, and the errors for every parameter
batchyard cannot honour (all client-side: no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchyard.compat.azureml.core import Environment, ScriptRunConfig
from batchyard.compat.azureml.core.compute import AmlCompute
from batchyard.compat.azureml.core.conda_dependencies import CondaDependencies
from batchyard.compat.azureml.core.runconfig import (
    DockerConfiguration,
    MpiConfiguration,
    PyTorchConfiguration,
    RunConfiguration,
    TensorflowConfiguration,
)
from batchyard.compat.azureml.core.workspace import Workspace
from batchyard.compat.azureml.exceptions import TrainingException, UnsupportedParameterError
from batchyard.compat.azureml.train.dnn import Chainer, Gloo, Mpi, Nccl, PyTorch, TensorFlow
from batchyard.compat.azureml.train.estimator import Estimator


@pytest.fixture
def src(tmp_path: Path) -> str:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "requirements.txt").write_text("six  # comment\n\nnumpy>=1.0\n")
    return str(tmp_path)


def test_pytorch_mpi_estimator_like_seed_001(src: str) -> None:
    est = PyTorch(source_directory=src, compute_target="gpucluster", entry_script="train.py",
                  node_count=2, process_count_per_node=1, distributed_backend="mpi",
                  use_gpu=True, script_params={"--epochs": 3, "--flag": ""})
    sub = est._to_submission({"team": "a"})
    spec = sub.spec
    assert sub.compute_target == "gpucluster" and sub.source_directory == src
    assert spec.nodes == 2
    assert spec.distribution.type == "mpi" and spec.distribution.processes_per_node == 1
    assert spec.distribution.process_count == 2
    assert spec.command == ["python", "train.py", "--epochs", "3", "--flag"]
    assert set(spec.outputs) == {"OUTPUTS", "LOGS"}
    assert spec.prepare is not None and 'ln -sfn "$BATCHYARD_OUTPUT_OUTPUTS" outputs' in \
        spec.prepare
    assert spec.tags == {"azureml.framework": "PyTorch", "team": "a"}


def test_mpi_process_count_is_nodes_times_processes_per_node(src: str) -> None:
    spec = Chainer(src, entry_script="train.py", node_count=2, process_count_per_node=4,
                   distributed_backend="mpi").to_job_spec()
    assert spec.distribution.process_count == 8 and spec.total_processes == 8


@pytest.mark.parametrize(("backend", "use_gpu", "hint"), [("gloo", False, "gloo"),
                                                          ("nccl", False, "auto"),
                                                          ("nccl", True, "auto")])
def test_gloo_and_nccl_are_torch_distributed(src: str, backend: str, use_gpu: bool,
                                             hint: str) -> None:
    spec = PyTorch(src, entry_script="train.py", node_count=2, process_count_per_node=2,
                   distributed_backend=backend, use_gpu=use_gpu).to_job_spec()
    assert spec.distribution.type == "pytorch" and spec.distribution.backend == hint
    assert spec.total_processes == 4


def test_distributed_training_objects(src: str) -> None:
    mpi = Estimator(src, entry_script="train.py", node_count=3,
                    distributed_training=Mpi(process_count_per_node=2)).to_job_spec()
    assert mpi.distribution.type == "mpi" and mpi.nodes == 3 and mpi.total_processes == 6
    gloo = PyTorch(src, entry_script="train.py", node_count=2,
                   distributed_training=Gloo()).to_job_spec()
    assert gloo.distribution.backend == "gloo"
    nccl = PyTorch(src, entry_script="train.py", node_count=2,
                   distributed_training=Nccl(), use_gpu=True).to_job_spec()
    assert nccl.distribution.backend == "auto"
    tf = TensorFlow(src, entry_script="train.py", node_count=2, worker_count=2,
                    parameter_server_count=1, distributed_backend="ps").to_job_spec()
    assert tf.distribution.type == "tensorflow" and tf.total_processes == 3
    assert tf.distribution.parameter_server_count == 1 and tf.distribution.worker_count == 2


def test_single_process_estimator_runs_once(src: str) -> None:
    spec = Estimator(src, entry_script="train.py",
                     environment_variables={"A": 1}, max_run_duration_seconds=90,
                     pip_requirements_file="requirements.txt").to_job_spec()
    assert spec.distribution.type == "custom" and spec.total_processes == 1
    assert spec.env == {"A": "1"} and spec.limits.max_wall_clock == 90
    assert spec.prepare is not None and "python -m batchyard.sdk.pip six 'numpy>=1.0'" in \
        spec.prepare
    assert isinstance(spec.command, str) and "pip-packages" in spec.command


def test_script_run_config_with_pytorch_configuration(src: str) -> None:
    env = Environment("my-env")
    env.python.conda_dependencies = CondaDependencies.create(
        pip_packages=["numpy", "azureml-defaults"], conda_packages=["python=3.11", "pip"])
    env.environment_variables = {"MODE": "fast"}
    config = ScriptRunConfig(source_directory=src, script="train.py", arguments=["--lr", 0.1],
                             compute_target="c2", environment=env,
                             distributed_job_config=PyTorchConfiguration(process_count=4,
                                                                         node_count=2))
    sub = config._to_submission()
    spec = sub.spec
    assert sub.compute_target == "c2"
    assert spec.nodes == 2 and spec.distribution.processes_per_node == 2
    assert spec.distribution.backend == "auto"  # Nccl asked: nccl on GPUs, gloo without
    assert spec.env == {"MODE": "fast"}
    assert spec.prepare is not None and "batchyard.sdk.pip numpy" in spec.prepare
    assert "azureml-defaults" not in spec.prepare  # the compat layer stands in for it
    mpi = ScriptRunConfig(src, command=["bash", "-c", "echo hi"],
                          distributed_job_config=MpiConfiguration(2, 2)).to_job_spec()
    assert mpi.command == ["bash", "-c", "echo hi"] and mpi.total_processes == 4
    tf = ScriptRunConfig(src, "train.py",
                         distributed_job_config=TensorflowConfiguration(2, 1)).to_job_spec()
    assert tf.distribution.type == "tensorflow" and tf.total_processes == 3
    rc = RunConfiguration()
    rc.node_count = 1
    rc.environment_variables = {"B": "2"}
    assert ScriptRunConfig(src, "train.py", run_config=rc).to_job_spec().env == {"B": "2"}


def test_data_references_become_inputs_and_arguments(src: str, tmp_path: Path) -> None:
    from batchyard.compat.azureml.data.data_reference import DataReference

    class Store:
        name = "workspaceblobstore"
        root = tmp_path / "store"

    ref = DataReference(Store(), path_on_datastore="mnist").as_mount()
    spec = Estimator(src, entry_script="train.py", script_params={"--data": ref}).to_job_spec()
    path = str(tmp_path / "store" / "mnist")
    assert spec.command == ["python", "train.py", "--data", path]
    assert spec.inputs["workspaceblobstore"].path == path
    assert spec.env["AZUREML_DATAREFERENCE_workspaceblobstore"] == path


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"conda_packages": ["scipy"]}, "conda_packages"),
    ({"conda_dependencies_file_path": "env.yml"}, "conda_dependencies_file_path"),
    ({"vm_size": "STANDARD_NC6"}, "vm_size"),
    ({"resume_from": object()}, "resume_from"),
])
def test_unhonoured_estimator_parameters_are_refused_by_name(src: str, kwargs: dict,
                                                             named: str) -> None:
    with pytest.raises(UnsupportedParameterError, match=named) as info:
        Estimator(src, entry_script="train.py", **kwargs)
    assert named in info.value.parameters


def test_unhonoured_environments_are_refused_by_name(src: str) -> None:
    conda = Environment("conda-env")
    conda.python.conda_dependencies.add_conda_package("scipy")
    with pytest.raises(UnsupportedParameterError, match=r"conda_packages \(scipy\)"):
        ScriptRunConfig(src, "train.py", environment=conda).to_job_spec()
    with pytest.raises(UnsupportedParameterError, match="arguments"):
        ScriptRunConfig(src, "train.py", docker_runtime_config=DockerConfiguration(
            True, arguments=["--privileged"])).to_job_spec()


def test_script_run_config_runs_docker_images(src: str) -> None:
    docker = Environment.from_docker_image("img", "me/image:1")
    spec = ScriptRunConfig(src, "train.py", environment=docker,
                           docker_runtime_config=DockerConfiguration(True, shm_size="4g"),
                           ).to_job_spec()
    assert spec.environment.image == "me/image:1"
    assert spec.environment.shm_size == "4g"


def test_configuration_mistakes_are_training_exceptions(src: str) -> None:
    with pytest.raises(TrainingException, match="distributed_backend"):
        PyTorch(src, entry_script="train.py", distributed_backend="horovod")
    with pytest.raises(TrainingException, match="needs distributed_backend"):
        Estimator(src, entry_script="train.py", node_count=2).to_job_spec()
    with pytest.raises(TrainingException, match=r"entry script 'missing\.py' not found"):
        Estimator(src, entry_script="missing.py").to_job_spec()
    with pytest.raises(TrainingException, match="source_directory"):
        Estimator(src + "/nope", entry_script="train.py").to_job_spec()
    with pytest.raises(TrainingException, match="not a multiple"):
        ScriptRunConfig(src, "train.py", distributed_job_config=PyTorchConfiguration(
            process_count=3, node_count=2)).to_job_spec()
    with pytest.raises(TrainingException, match="pip_packages"):
        Estimator(src, entry_script="train.py", pip_packages=["--pre torch"]).to_job_spec()
    with pytest.raises(UnsupportedParameterError, match="amlcompute"):
        Estimator(src, entry_script="train.py", compute_target="amlcompute").to_job_spec()


def test_provisioning_configuration_defaults_and_refusals() -> None:
    config = AmlCompute.provisioning_configuration(vm_size="STANDARD_NC6",
                                                   vm_priority="lowpriority", max_nodes=2)
    assert (config.min_nodes, config.max_nodes, config.idle_seconds_before_scaledown) == \
        (0, 2, 120)
    for kwargs, named in (({"admin_username": "me"}, "admin_username"),
                          ({"vnet_name": "v"}, "vnet_name"),
                          ({"identity_type": "SystemAssigned"}, "identity_type")):
        with pytest.raises(UnsupportedParameterError, match=named):
            AmlCompute.provisioning_configuration(vm_size="STANDARD_NC6", max_nodes=2,
                                                  **kwargs)
    from batchyard.compat.azureml.exceptions import ComputeTargetException

    with pytest.raises(ComputeTargetException):
        AmlCompute.provisioning_configuration(min_nodes=3, max_nodes=2)


def test_workspace_create_refuses_azure_resources() -> None:
    with pytest.raises(UnsupportedParameterError, match="storage_account"):
        Workspace.create("w", storage_account="/subscriptions/x/storage")
