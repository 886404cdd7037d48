"""Batch AI cluster.json read into ClusterSpec."""

from __future__ import annotations

import pytest

from batchyard.errors import SpecError, Unsupported
from batchyard.spec.batchai import read_batchai_cluster


def test_manual_cluster() -> None:
    spec = read_batchai_cluster({"properties": {
        "vmSize": "STANDARD_NC6", "vmPriority": "lowpriority",
        "scaleSettings": {"manual": {"targetNodeCount": 2,
                                     "nodeDeallocationOption": "waitForJobCompletion"}},
        "nodeSetup": {"setupTask": {"commandLine": "pip install chainer",
                                    "environmentVariables": [{"name": "X", "value": "1"}]}},
        "userAccountSettings": {"adminUserName": "me", "adminUserSshPublicKey": "ssh-rsa A"},
    }}, "nc6")
    assert spec.name == "nc6"
    assert spec.vm_priority == "lowpriority"
    assert spec.manual is not None
    assert spec.manual.target_node_count == 2
    assert spec.manual.node_deallocation_option == "waitforjobcompletion"
    assert spec.setup_task is not None
    assert spec.setup_task.command == "pip install chainer"
    assert spec.setup_task.env == {"X": "1"}


def test_autoscale_cluster() -> None:
    spec = read_batchai_cluster({"vmSize": "Standard_D2_v2", "scaleSettings": {"autoScale": {
        "minimumNodeCount": 0, "maximumNodeCount": 4, "initialNodeCount": 1}}}, "cpu")
    assert spec.autoscale is not None
    assert (spec.autoscale.min_nodes, spec.autoscale.max_nodes) == (0, 4)
    assert spec.initial_nodes == 1


def test_unknown_vm_size_names_vm_size() -> None:
    with pytest.raises(SpecError, match="vmSize: unknown node size"):
        read_batchai_cluster({"vmSize": "Standard_XYZ"}, "c")


def test_subnet_refused() -> None:
    data = {"vmSize": "Standard_D2_v2", "subnet": {"id": "/subscriptions/s/subnets/x"}}
    with pytest.raises(Unsupported, match="subnet"):
        read_batchai_cluster(data, "c")
    assert read_batchai_cluster(data, "c", ignore={"subnet"}).vm_size == "Standard_D2_v2"


def test_cluster_azure_mount_refused() -> None:
    data = {"vmSize": "Standard_D2_v2", "nodeSetup": {"mountVolumes": {"azureFileShares": [
        {"azureFileUrl": "https://a.file.core.windows.net/s", "relativeMountPath": "s"}]}}}
    with pytest.raises(Unsupported, match=r"nodeSetup\.mountVolumes: cluster-wide mounts"):
        read_batchai_cluster(data, "c")
    read_batchai_cluster(data, "c", ignore={"nodeSetup.mountVolumes"})


def test_cluster_unknown_property() -> None:
    with pytest.raises(SpecError, match=r"scaleSettings\.manual\.nodes: unknown field"):
        read_batchai_cluster({"vmSize": "Standard_D2_v2",
                              "scaleSettings": {"manual": {"targetNodeCount": 1, "nodes": 1}}},
                             "c")
