"""An unknown field or node size names the nearest known one (issue 33 #16): `node` ->
`nodes` in a native job, camelCase properties in a Batch AI job.json, AML v2 fields, fields
nested in lists and mappings, a sweep's fields; `did you mean Standard_D3_v2?` for a size. A
word close to nothing gets no guess."""

from __future__ import annotations

from typing import Any

import pytest

from batchyard.errors import SpecError
from batchyard.spec.loader import load_cluster_dict, load_job_dict
from batchyard.spec.sizes import lookup
from batchyard.spec.sweep import validate as validate_sweep
from batchyard.suggest import nearest


def message(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as caught:
        load_job_dict(data)
    return caught.value


BATCHAI = {"nodeCount": 1, "customToolkitSettings": {"commandLine": "true"}}
AML = {"type": "command", "command": "true"}


@pytest.mark.parametrize(("data", "field", "meant"), [
    ({"node": 2, "command": "x"}, "node", "nodes"),
    ({"command": "x", "distribution": {"typ": "mpi"}}, "distribution.typ", "type"),
    ({"command": "x", "limits": {"max_wallclock": "1h"}}, "limits.max_wallclock",
     "max_wall_clock"),
    ({"command": "x", "outputs": {"M": {"path_prefx": "/a"}}}, "outputs.M.path_prefx",
     "path_prefix"),
    ({"command": "x", "mounts": [{"relative_path": "a", "sorce": "/x"}]}, "mounts[0].sorce",
     "source"),
    ({"command": "x", "environment": {"imag": "busybox"}}, "environment.imag", "image"),
    ({"properties": {**BATCHAI, "nodeCont": 2}}, "nodeCont", "nodeCount"),
    ({**BATCHAI, "jobPreparation": {"comandLine": "x"}}, "jobPreparation.comandLine",
     "commandLine"),
    ({**BATCHAI, "outputDirectories": [{"id": "M", "pathPrefx": "/a"}]},
     "outputDirectories[0].pathPrefx", "pathPrefix"),
    ({**AML, "resources": {"instance_cont": 2}}, "resources.instance_cont", "instance_count"),
    ({**AML, "enviroment_variables": {}}, "enviroment_variables", "environment_variables"),
    ({**AML, "distribuion": {"type": "pytorch"}}, "distribuion", "distribution"),
])
def test_an_unknown_field_names_the_nearest(data: dict[str, Any], field: str,
                                            meant: str) -> None:
    error = message(data)
    assert f"{field}: unknown field; did you mean {meant}?" in error.message, error.message
    detail = next(d for d in error.details or [] if d["field"] == field)
    assert detail["suggestion"] == meant


def test_next_to_properties_too() -> None:
    error = message({"propertes": {}, "properties": BATCHAI})
    assert "did you mean properties?" in error.message, error.message


def test_a_field_close_to_nothing_gets_no_guess() -> None:
    error = message({"command": "x", "zzzqqq": 1})
    assert error.message.endswith("zzzqqq: unknown field"), error.message


def test_cluster_and_sweep_fields() -> None:
    with pytest.raises(SpecError) as caught:
        load_cluster_dict({"name": "c", "vm_size": "Standard_D2_v2", "vm_priorty": "x"})
    assert "did you mean vm_priority?" in caught.value.message, caught.value.message
    with pytest.raises(SpecError) as sweep:
        validate_sweep({"trial": {"command": "x"}, "search_space": {"a": [1]},
                        "objective": {"primary_metric": "m", "goal": "max"},
                        "sampling": {"typ": "grid"}}, "sweep.yml")
    assert "sampling.typ: unknown field; did you mean type?" in sweep.value.message


@pytest.mark.parametrize(("typed", "meant"), [
    ("Standard_D3", "Standard_D3_v2"), ("Standard_D3v2", "Standard_D3_v2"),
    ("standard_d3_v2x", "Standard_D3_v2"), ("NC6", "Standard_NC6"),
    ("Standard_ND40rs", "Standard_ND40rs_v2")])
def test_an_unknown_size_names_the_nearest(typed: str, meant: str) -> None:
    with pytest.raises(SpecError) as caught:
        lookup(typed)
    assert f"unknown node size {typed!r}; did you mean {meant}?" in caught.value.message
    assert "Standard_D1_v2" in caught.value.message  # the known sizes still follow


def test_no_guess_for_a_size_like_nothing() -> None:
    with pytest.raises(SpecError) as caught:
        lookup("xyz")
    assert "did you mean" not in caught.value.message


def test_nearest() -> None:
    assert nearest("node", ["nodes", "name", "code"]) == "nodes"
    assert nearest("GPU", ["gpu", "cpu-big"]) == "gpu"  # case aside
    assert nearest("qqq", ["gpu", "cpu"]) is None
    assert nearest("x", []) is None
