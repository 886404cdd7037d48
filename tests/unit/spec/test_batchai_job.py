"""Batch AI job.json (API 2018-05-01) read into the native JobSpec."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from batchyard.errors import SpecError, Unsupported
from batchyard.spec import batchai
from batchyard.spec.batchai import read_batchai_job

SEED_000: dict[str, Any] = {
    "$schema": "https://raw.githubusercontent.com/Azure/BatchAI/master/schemas/2018-05-01/job.json",
    "properties": {
        "nodeCount": 2,
        "chainerSettings": {
            "pythonScriptFilePath": "$AZ_BATCHAI_JOB_MOUNT_ROOT/scripts/chainer/train_mnist.py",
            "commandLineArgs": "-g --communicator non_cuda_aware -o $AZ_BATCHAI_OUTPUT_MODEL",
            "processCount": 8,
        },
        "jobPreparation": {
            "commandLine": "bash $AZ_BATCHAI_JOB_MOUNT_ROOT/scripts/chainer/jobprep.sh"
        },
        "stdOutErrPathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/logs",
        "mountVolumes": {
            "azureFileShares": [
                {
                    "azureFileUrl": "https://<AZURE_BATCHAI_STORAGE_ACCOUNT>.file.core.windows.net/logs",
                    "relativeMountPath": "logs",
                }
            ],
            "azureBlobFileSystems": [
                {
                    "accountName": "<Storage Account Name>",
                    "containerName": "scripts",
                    "credentials": {"accountKey": "<Storage Account Key>"},
                    "relativeMountPath": "scripts",
                },
                {
                    "accountName": "<Storage Account Name>",
                    "containerName": "result",
                    "credentials": {"accountKey": "<Storage Account Key>"},
                    "relativeMountPath": "result",
                },
            ],
        },
        "outputDirectories": [{"id": "MODEL", "pathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/result"}],
        "containerSettings": {
            "imageSourceRegistry": {"image": "batchaitraining/chainermn:IntelMPI"}
        },
    },
}


def job(block: str, settings: dict[str, Any], **props: Any) -> dict[str, Any]:
    return {"properties": {"nodeCount": props.pop("nodeCount", 2), block: settings, **props}}


def test_seed_000_runs_in_its_image() -> None:
    """containerSettings is honoured now (no --ignore): the ranks run in the recipe's image."""
    spec = read_batchai_job(copy.deepcopy(SEED_000))
    assert spec.environment.image == "batchaitraining/chainermn:IntelMPI"
    assert spec.environment.registry is None and spec.mpi.flavour is None


def test_seed_000_storage_mounts_read() -> None:
    """Seed 000's blob containers and logs share become storage mounts (the key is kept for
    the node and masked in the redacted view)."""
    spec = read_batchai_job(copy.deepcopy(SEED_000))
    kinds = [(m.kind, m.relative_path) for m in spec.mounts]
    assert kinds == [("azure_files", "logs"), ("azure_blob", "scripts"),
                     ("azure_blob", "result")]
    assert spec.mounts[0].source.endswith(".file.core.windows.net/logs")
    assert spec.mounts[1].account_key == "<Storage Account Key>"
    assert "<Storage Account Key>" not in str(spec.redacted())


def test_seed_000_parses_with_ignores() -> None:
    spec = read_batchai_job(copy.deepcopy(SEED_000))
    assert spec.nodes == 2
    assert spec.distribution.type == "mpi"
    assert spec.distribution.process_count == 8
    assert spec.distribution.processes_per_node == 4
    assert spec.command == (
        "python $AZ_BATCHAI_JOB_MOUNT_ROOT/scripts/chainer/train_mnist.py "
        "-g --communicator non_cuda_aware -o $AZ_BATCHAI_OUTPUT_MODEL"
    )
    assert spec.prepare == "bash $AZ_BATCHAI_JOB_MOUNT_ROOT/scripts/chainer/jobprep.sh"
    assert spec.stdouterr_path_prefix == "$AZ_BATCHAI_JOB_MOUNT_ROOT/logs"
    assert spec.outputs["MODEL"].path_prefix == "$AZ_BATCHAI_JOB_MOUNT_ROOT/result"
    assert len(spec.mounts) == 3
    assert spec.total_processes == 8


def test_ignore_accepts_properties_prefix_and_exact_item() -> None:
    data = copy.deepcopy(SEED_000)
    data["properties"]["secrets"] = [{"name": "K", "keyVaultSecretReference": {
        "sourceVault": {"id": "/subscriptions/x"}, "secretUrl": "https://v/secrets/k"}}]
    ignore = {"properties.secrets[0].keyVaultSecretReference",
              "mountVolumes.azureFileShares[0]", "mountVolumes.azureBlobFileSystems"}
    spec = read_batchai_job(data, ignore=ignore)
    assert spec.secrets == {}
    assert len(spec.mounts) == 3  # storage mounts are reachable now: nothing to drop


def test_bare_properties_accepted() -> None:
    spec = read_batchai_job({"nodeCount": 1, "customToolkitSettings": {"commandLine": "echo hi"}})
    assert spec.distribution.type == "custom"
    assert spec.command == "echo hi"


def test_pytorch() -> None:
    spec = read_batchai_job(job("pyTorchSettings", {
        "pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPTS/mnist.py",
        "pythonInterpreterPath": "/opt/py/bin/python",
        "commandLineArgs": "--dist_url $AZ_BATCHAI_PYTORCH_INIT_METHOD --world_size 4",
        "processCount": 4, "communicationBackend": "Gloo",
    }))
    assert spec.distribution.type == "pytorch"
    assert spec.distribution.processes_per_node == 2
    assert spec.distribution.backend == "gloo"
    assert spec.environment.python == "/opt/py/bin/python"
    assert spec.command == ("/opt/py/bin/python $AZ_BATCHAI_INPUT_SCRIPTS/mnist.py "
                            "--dist_url $AZ_BATCHAI_PYTORCH_INIT_METHOD --world_size 4")


def test_pytorch_process_count_defaults_to_node_count() -> None:
    spec = read_batchai_job(job("pyTorchSettings", {"pythonScriptFilePath": "t.py"}, nodeCount=3))
    assert spec.distribution.processes_per_node == 1
    assert spec.total_processes == 3


def test_pytorch_uneven_process_count_names_the_property() -> None:
    with pytest.raises(SpecError, match=r"pyTorchSettings\.processCount"):
        read_batchai_job(job("pyTorchSettings", {"pythonScriptFilePath": "t.py",
                                                 "processCount": 3}))


def test_script_path_quoted_only_without_variables() -> None:
    spec = read_batchai_job(job("chainerSettings", {"pythonScriptFilePath": "/my dir/t.py"}))
    assert spec.command == "python '/my dir/t.py'"


@pytest.mark.parametrize("block", ["chainerSettings", "horovodSettings"])
def test_mpi_python_frameworks(block: str) -> None:
    spec = read_batchai_job(job(block, {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_S/t.py",
                                        "commandLineArgs": "--epochs 1", "processCount": 3}))
    assert spec.distribution.type == "mpi"
    assert spec.distribution.process_count == 3
    assert spec.distribution.processes_per_node == 2  # ceil(3 / 2)
    assert spec.command == "python $AZ_BATCHAI_INPUT_S/t.py --epochs 1"


def test_mpi_process_count_defaults_to_node_count() -> None:
    spec = read_batchai_job(job("horovodSettings", {"pythonScriptFilePath": "t.py"}, nodeCount=4))
    assert spec.distribution.process_count == 4
    assert spec.distribution.processes_per_node == 1


def test_caffe2() -> None:
    spec = read_batchai_job(job("caffe2Settings", {"pythonScriptFilePath": "t.py",
                                                   "commandLineArgs": "--x"}))
    assert (spec.distribution.type, spec.distribution.process_count) == ("mpi", 2)
    assert spec.command == "python t.py --x"


def test_custom_mpi() -> None:
    spec = read_batchai_job(job("customMpiSettings", {
        "commandLine": "python $AZ_BATCHAI_INPUT_S/hvd.py", "processCount": 8}))
    assert spec.distribution.type == "mpi"
    assert spec.distribution.process_count == 8
    assert spec.distribution.processes_per_node == 4
    assert spec.command == "python $AZ_BATCHAI_INPUT_S/hvd.py"


def test_custom_toolkit() -> None:
    spec = read_batchai_job(job("customToolkitSettings", {
        "commandLine": "mpirun --hostfile $AZ_BATCHAI_MPI_HOST_FILE python t.py"}))
    assert spec.distribution.type == "custom"
    assert spec.nodes == 2
    assert spec.command == "mpirun --hostfile $AZ_BATCHAI_MPI_HOST_FILE python t.py"


def test_cntk_python_and_brainscript() -> None:
    spec = read_batchai_job(job("cntkSettings", {
        "languageType": "Python", "pythonScriptFilePath": "$AZ_BATCHAI_INPUT_S/cifar.py",
        "commandLineArgs": "--datadir $AZ_BATCHAI_INPUT_DATA", "processCount": 2}))
    assert spec.distribution.type == "mpi"
    assert spec.command == "python $AZ_BATCHAI_INPUT_S/cifar.py --datadir $AZ_BATCHAI_INPUT_DATA"
    spec = read_batchai_job(job("cntkSettings", {
        "languageType": "BrainScript", "configFilePath": "$AZ_BATCHAI_INPUT_S/conv.cntk",
        "commandLineArgs": "OutputDir=$AZ_BATCHAI_OUTPUT_MODEL"}))
    assert spec.command == "cntk configFile=$AZ_BATCHAI_INPUT_S/conv.cntk " \
        "OutputDir=$AZ_BATCHAI_OUTPUT_MODEL"
    assert spec.distribution.process_count == 2


def test_cntk_brainscript_needs_config_file() -> None:
    with pytest.raises(SpecError, match=r"cntkSettings\.configFilePath"):
        read_batchai_job(job("cntkSettings", {"languageType": "BrainScript"}))


def test_caffe_config_or_script() -> None:
    spec = read_batchai_job(job("caffeSettings", {
        "configFilePath": "$AZ_BATCHAI_INPUT_S/lenet_solver.prototxt", "processCount": 4}))
    assert spec.command == "caffe train --solver=$AZ_BATCHAI_INPUT_S/lenet_solver.prototxt"
    assert spec.distribution.process_count == 4
    spec = read_batchai_job(job("caffeSettings", {"pythonScriptFilePath": "t.py"}))
    assert spec.command == "python t.py"
    with pytest.raises(SpecError, match=r"caffeSettings\.configFilePath"):
        read_batchai_job(job("caffeSettings", {"configFilePath": "a", "pythonScriptFilePath": "b"}))


def test_tensorflow_distributed_recipe() -> None:
    spec = read_batchai_job(job("tensorFlowSettings", {
        "parameterServerCount": 1, "workerCount": 2,
        "pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPT/mnist_replica.py",
        "masterCommandLineArgs": "--job_name=worker --task_index=$AZ_BATCHAI_TASK_INDEX",
        "workerCommandLineArgs": "--job_name=worker --task_index=$AZ_BATCHAI_TASK_INDEX",
        "parameterServerCommandLineArgs": "--job_name=ps --ps_hosts=$AZ_BATCHAI_PS_HOSTS",
    }))
    dist = spec.distribution
    assert dist.type == "tensorflow"
    assert (dist.worker_count, dist.parameter_server_count) == (2, 1)
    assert set(dist.role_commands) == {"chief", "worker", "ps"}
    assert dist.role_commands["chief"] == (
        "python $AZ_BATCHAI_INPUT_SCRIPT/mnist_replica.py "
        "--job_name=worker --task_index=$AZ_BATCHAI_TASK_INDEX")
    assert dist.role_commands["ps"] == (
        "python $AZ_BATCHAI_INPUT_SCRIPT/mnist_replica.py --job_name=ps "
        "--ps_hosts=$AZ_BATCHAI_PS_HOSTS")
    assert spec.total_processes == 3
    assert dist.processes_per_node == 2


def test_tensorflow_single_process() -> None:
    spec = read_batchai_job(job("tensorFlowSettings", {
        "pythonScriptFilePath": "mnist.py", "masterCommandLineArgs": "--steps 10"}, nodeCount=1))
    assert spec.distribution.role_commands == {"chief": "python mnist.py --steps 10"}
    assert spec.total_processes == 1


def test_exactly_one_framework_block() -> None:
    with pytest.raises(SpecError, match=r"pyTorchSettings / chainerSettings"):
        read_batchai_job({"nodeCount": 1, "pyTorchSettings": {"pythonScriptFilePath": "a"},
                          "chainerSettings": {"pythonScriptFilePath": "a"}})
    with pytest.raises(SpecError, match="exactly one framework block"):
        read_batchai_job({"nodeCount": 1})


def test_common_blocks() -> None:
    spec = read_batchai_job(job("customToolkitSettings", {"commandLine": "run"},
        environmentVariables=[{"name": "EPOCHS", "value": "3"}],
        secrets=[{"name": "TOKEN", "value": "s3cret"}],
        inputDirectories=[{"id": "DATA", "path": "$AZ_BATCHAI_JOB_MOUNT_ROOT/data"}],
        outputDirectories=[{"id": "MODEL", "pathPrefix": "/out", "pathSuffix": "models"}],
        constraints={"maxWallClockTime": "1.02:03:04"}, schedulingPriority="high",
        cluster={"id": "/subscriptions/x/workspaces/w/clusters/nc6"}))
    assert spec.env == {"EPOCHS": "3"}
    assert spec.secrets == {"TOKEN": "s3cret"}
    assert spec.inputs["DATA"].path == "$AZ_BATCHAI_JOB_MOUNT_ROOT/data"
    assert spec.inputs["DATA"].mode == "direct"
    assert (spec.outputs["MODEL"].path_prefix, spec.outputs["MODEL"].path_suffix) == (
        "/out", "models")
    assert spec.limits.max_wall_clock == 86400 + 2 * 3600 + 3 * 60 + 4
    assert spec.priority == "high"
    assert spec.cluster == "nc6"


@pytest.mark.parametrize(("text", "seconds"), [
    ("02:00:00", 7200), ("7.00:00:00", 7 * 86400), ("P1DT2H", 93600), ("PT90S", 90),
])
def test_max_wall_clock_time(text: str, seconds: float) -> None:
    spec = read_batchai_job(job("customToolkitSettings", {"commandLine": "x"},
                                constraints={"maxWallClockTime": text}))
    assert spec.limits.max_wall_clock == seconds


def test_bad_max_wall_clock_time_names_it() -> None:
    with pytest.raises(SpecError, match=r"constraints\.maxWallClockTime"):
        read_batchai_job(job("customToolkitSettings", {"commandLine": "x"},
                             constraints={"maxWallClockTime": "soon"}))


def test_secrets_redacted() -> None:
    spec = read_batchai_job(job("customToolkitSettings", {"commandLine": "x"},
                                secrets=[{"name": "TOKEN", "value": "s3cret"}]))
    assert spec.secrets["TOKEN"] == "s3cret"
    shown = spec.redacted()
    assert shown["secrets"] == {"TOKEN": "***"}
    assert "s3cret" not in str(shown)


def test_key_vault_secret_refused_then_ignored() -> None:
    data = job("customToolkitSettings", {"commandLine": "x"}, secrets=[
        {"name": "TOKEN", "keyVaultSecretReference": {"secretUrl": "https://kv/secrets/t"}}])
    with pytest.raises(Unsupported, match=r"secrets\[0\]\.keyVaultSecretReference"):
        read_batchai_job(data)
    assert read_batchai_job(data, ignore={"secrets[0]"}).secrets == {}


def test_unknown_property_named() -> None:
    with pytest.raises(SpecError, match=r"pyTorchSettings\.scriptPath: unknown field"):
        read_batchai_job(job("pyTorchSettings", {"pythonScriptFilePath": "a", "scriptPath": "b"}))
    with pytest.raises(SpecError, match="nodeCnt: unknown field"):
        read_batchai_job(job("customToolkitSettings", {"commandLine": "x"}, nodeCnt=2))
    with pytest.raises(SpecError, match="extra: unknown field"):
        read_batchai_job({"properties": {"nodeCount": 1}, "extra": 1})


def test_type_error_names_field() -> None:
    with pytest.raises(SpecError, match="nodeCount") as info:
        read_batchai_job(job("customToolkitSettings", {"commandLine": "x"}, nodeCount="two"))
    assert "properties." not in str(info.value)


def test_nested_error_path() -> None:
    with pytest.raises(SpecError, match=r"environmentVariables\[1\]\.name"):
        read_batchai_job(job("customToolkitSettings", {"commandLine": "x"},
            environmentVariables=[{"name": "A", "value": "1"}, {"name": "bad-name", "value": ""}]))


def test_local_mounts() -> None:
    spec = read_batchai_job(job("customToolkitSettings", {"commandLine": "x"}, mountVolumes={
        "azureFileShares": [{"azureFileUrl": "file:///srv/logs", "relativeMountPath": "logs"}],
        "azureBlobFileSystems": [{"accountName": "acct", "containerName": "/data/scripts",
                                  "credentials": {"accountKey": "k"},
                                  "relativeMountPath": "scripts"}],
        "fileServers": [{"fileServer": {"id": "nfs1:/export"}, "sourceDirectory": "home",
                         "relativeMountPath": "nfs"}],
        "unmanagedFileSystems": [{"mountCommand": "mount -t nfs h:/x", "relativeMountPath": "u"}],
    }))
    kinds = [(m.kind, m.relative_path, m.source) for m in spec.mounts]
    assert kinds == [("local", "logs", "/srv/logs"), ("local", "scripts", "/data/scripts"),
                     ("file_server", "nfs", "nfs1:/export/home"), ("unmanaged", "u", "")]
    assert spec.mounts[1].account_key is None
    assert spec.mounts[3].mount_command == "mount -t nfs h:/x"


def test_azure_blob_mount_read() -> None:
    data = job("customToolkitSettings", {"commandLine": "x"}, mountVolumes={
        "azureBlobFileSystems": [{"accountName": "acct", "containerName": "c",
                                  "credentials": {"accountKey": "k"}, "relativeMountPath": "b"}]})
    mount = read_batchai_job(data).mounts[0]
    assert (mount.kind, mount.source, mount.account_key) == ("azure_blob", "acct/c", "k")


def test_azure_account_key_mapped_and_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once storage is reachable, accountKey must land in account_key and never be shown."""
    monkeypatch.setattr(batchai, "REACHABLE_MOUNT_KINDS",
                        batchai.REACHABLE_MOUNT_KINDS | {"azure_blob"})
    spec = read_batchai_job(job("customToolkitSettings", {"commandLine": "x"}, mountVolumes={
        "azureBlobFileSystems": [{"accountName": "acct", "containerName": "c",
                                  "credentials": {"accountKey": "k3y"},
                                  "relativeMountPath": "b"}]}))
    mount = spec.mounts[0]
    assert (mount.kind, mount.source, mount.account_name, mount.account_key) == (
        "azure_blob", "acct/c", "acct", "k3y")
    assert "k3y" not in str(spec.redacted())


def test_duplicate_ids() -> None:
    with pytest.raises(SpecError, match=r"outputDirectories\[1\]\.id"):
        read_batchai_job(job("customToolkitSettings", {"commandLine": "x"}, outputDirectories=[
            {"id": "M", "pathPrefix": "/a"}, {"id": "M", "pathPrefix": "/b"}]))
