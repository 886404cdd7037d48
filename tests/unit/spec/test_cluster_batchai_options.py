"""Seed 000's cluster options in the cluster spec (auto storage, the node image) and the
CNTK BrainScript command line, as pure logic."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from batchyard.spec.batchai import read_batchai_job
from batchyard.spec.cluster import IMAGE_ALIASES, ClusterSpec


def test_auto_storage_and_image_fields() -> None:
    spec = ClusterSpec.model_validate({"name": "c", "auto_storage": True, "image": "UbuntuLTS"})
    assert spec.auto_storage is True and spec.image == "UbuntuLTS"
    assert ClusterSpec.model_validate({"name": "c"}).auto_storage is False
    urn = "microsoft-ads:linux-data-science-vm-ubuntu:linuxdsvmubuntu:latest"
    assert ClusterSpec.model_validate({"name": "c", "image": urn}).image == urn
    assert set(IMAGE_ALIASES) == {"UbuntuLTS", "UbuntuDSVM"}


@pytest.mark.parametrize("image", ["Win2016Datacenter", "ubuntults", "a:b", "x y:z:w"])
def test_unknown_image_names_the_allowed_values(image: str) -> None:
    with pytest.raises(ValidationError, match="UbuntuLTS, UbuntuDSVM or publisher:offer"):
        ClusterSpec.model_validate({"name": "c", "image": image})


def test_cntk_brainscript_multi_process_runs_under_mpi() -> None:
    """Batch AI ran a BrainScript config under mpirun: ``cntk configFile=<cfg> <args>`` on
    processCount ranks spread over the nodes."""
    spec = read_batchai_job({"properties": {"nodeCount": 2, "cntkSettings": {
        "configFilePath": "$AZ_BATCHAI_INPUT_SCRIPT/ConvNet_MNIST.cntk",
        "commandLineArgs": "rootDir=. dataDir=$AZ_BATCHAI_INPUT_DATASET", "processCount": 4}}})
    assert spec.command == ("cntk configFile=$AZ_BATCHAI_INPUT_SCRIPT/ConvNet_MNIST.cntk "
                            "rootDir=. dataDir=$AZ_BATCHAI_INPUT_DATASET")
    assert (spec.distribution.type, spec.distribution.process_count,
            spec.distribution.processes_per_node) == ("mpi", 4, 2)
    plain = read_batchai_job({"properties": {"nodeCount": 1, "cntkSettings": {
        "languageType": "BrainScript", "configFilePath": "/data/my config.cntk"}}})
    assert plain.command == "cntk configFile='/data/my config.cntk'"
