"""Azure ML v2 command-job YAML read into the native JobSpec."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from batchyard.errors import SpecError, Unsupported
from batchyard.spec.amlv2 import read_aml_job

JOB = """
$schema: https://azuremlschemas.azureedge.net/latest/commandJob.schema.json
type: command
display_name: mnist-ddp
experiment_name: mnist
description: DDP on MNIST
code: ./src
command: >-
  python train.py --data ${{inputs.training_data}} --epochs ${{inputs.epochs}}
  --out ${{outputs.model_dir}}/final
environment: azureml:AzureML-pytorch-1.13-cuda11.7@latest
environment_variables:
  NCCL_DEBUG: INFO
  SEED: 7
compute: azureml:gpu-cluster
resources:
  instance_count: 2
distribution:
  type: pytorch
  process_count_per_instance: 4
limits:
  timeout: 3600
inputs:
  training_data:
    type: uri_folder
    path: ./data
    mode: download
  epochs: 3
outputs:
  model_dir:
    type: uri_folder
    mode: rw_mount
tags:
  team: vision
"""


def load(text: str = JOB, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(text)
    data.update(changes)
    return data


def test_command_job() -> None:
    spec = read_aml_job(load())
    assert spec.name == "mnist-ddp"
    assert spec.experiment == "mnist"
    assert spec.description == "DDP on MNIST"
    assert spec.cluster == "gpu-cluster"
    assert spec.nodes == 2
    assert spec.distribution.type == "pytorch"
    assert spec.distribution.processes_per_node == 4
    assert spec.limits.max_wall_clock == 3600
    assert spec.env == {"NCCL_DEBUG": "INFO", "SEED": "7"}
    assert spec.code == "./src"
    assert spec.inputs["TRAINING_DATA"].path == "./data"
    assert spec.inputs["TRAINING_DATA"].mode == "download"
    assert "MODEL_DIR" in spec.outputs
    assert spec.tags == {"team": "vision",
                         "aml_environment": "azureml:AzureML-pytorch-1.13-cuda11.7@latest"}


def test_references_substituted() -> None:
    spec = read_aml_job(load())
    assert spec.command == (
        "python train.py --data ${BATCHYARD_INPUT_TRAINING_DATA} --epochs 3 "
        "--out ${BATCHYARD_OUTPUT_MODEL_DIR}/final"
    )


def test_reference_with_spaces_and_unknown_reference() -> None:
    spec = read_aml_job(load(command="echo ${{ inputs.epochs }}"))
    assert spec.command == "echo 3"
    with pytest.raises(SpecError, match=r"command: \$\{\{inputs.nope\}\} names no input"):
        read_aml_job(load(command="echo ${{inputs.nope}}"))


@pytest.mark.parametrize("kind", ["mpi", "MPI"])
def test_mpi_distribution(kind: str) -> None:
    spec = read_aml_job(load(distribution={"type": kind, "process_count_per_instance": 2}))
    assert spec.distribution.type == "mpi"
    assert spec.distribution.processes_per_node == 2
    assert spec.total_processes == 4


def test_tensorflow_distribution() -> None:
    spec = read_aml_job(load(distribution={"type": "tensorflow", "worker_count": 2,
                                           "parameter_server_count": 2}))
    dist = spec.distribution
    assert (dist.type, dist.worker_count, dist.parameter_server_count) == ("tensorflow", 2, 2)
    assert dist.processes_per_node == 2
    assert spec.total_processes == 4


def test_tensorflow_uneven_uses_process_count() -> None:
    spec = read_aml_job(load(distribution={"type": "tensorflow", "worker_count": 2,
                                           "parameter_server_count": 1}))
    assert spec.total_processes == 3
    assert spec.distribution.processes_per_node == 2


def test_bad_distribution() -> None:
    with pytest.raises(SpecError, match=r"distribution\.type"):
        read_aml_job(load(distribution={"type": "ray"}))
    with pytest.raises(SpecError, match=r"distribution\.worker_count"):
        read_aml_job(load(distribution={"type": "pytorch", "worker_count": 2}))


def test_unknown_keys_named() -> None:
    with pytest.raises(SpecError, match="queue_settings: unknown field"):
        read_aml_job(load(queue_settings={"job_tier": "spot"}))
    with pytest.raises(SpecError, match=r"inputs\.training_data\.mode"):
        read_aml_job(load(inputs={"training_data": {"path": "x", "mode": "eval_mount"}}))


def test_minimal_job_and_name() -> None:
    spec = read_aml_job({"command": "echo hi", "name": "j1", "display_name": "Pretty"})
    assert spec.name == "j1"
    assert spec.nodes == 1
    with pytest.raises(SpecError, match="display_name"):
        read_aml_job({"command": "echo hi", "display_name": "has spaces"})


def test_other_job_types_unsupported() -> None:
    with pytest.raises(Unsupported, match="type"):
        read_aml_job({"type": "sweep", "command": "x"})


def test_datastore_output_bound() -> None:
    spec = read_aml_job(load(outputs={"model_dir": {
        "path": "azureml://datastores/workspaceblobstore/paths/out", "mode": "upload"}}))
    out = spec.outputs["MODEL_DIR"]
    assert (out.path, out.mode) == ("azureml://datastores/workspaceblobstore/paths/out", "upload")
    with pytest.raises(Unsupported, match=r"outputs\.model_dir\.path"):
        read_aml_job(load(outputs={"model_dir": {"path": "ftp://host/out"}}))
