"""Format detection, path resolution and syntax errors of job and cluster files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchyard.errors import SpecError
from batchyard.spec.loader import (
    detect_job_format,
    load_cluster_file,
    load_job_dict,
    load_job_file,
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_detects_batchai_json(tmp_path: Path) -> None:
    path = write(tmp_path, "job.json", json.dumps({"properties": {
        "nodeCount": 2, "chainerSettings": {"pythonScriptFilePath": "t.py"},
        "containerSettings": {"imageSourceRegistry": {"image": "x"}}}}))
    spec = load_job_file(path)
    assert spec.distribution.type == "mpi" and spec.environment.image == "x"


def test_detects_aml_yaml_and_resolves_paths(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yml", """
$schema: https://azuremlschemas.azureedge.net/latest/commandJob.schema.json
command: python train.py --data ${{inputs.data}}
code: src
inputs:
  data: {type: uri_folder, path: ../data}
""")
    spec = load_job_file(path)
    assert spec.code == str(tmp_path / "src")
    assert spec.inputs["DATA"].path == str(tmp_path.parent / "data")


def test_detects_native_yaml_and_keeps_variable_paths(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", """
name: hello
command: echo hi
code: .
inputs:
  data: $AZ_BATCHAI_JOB_MOUNT_ROOT/data
  abs: /srv/data
mounts:
  - {kind: local, relative_path: d, source: data}
""")
    spec = load_job_file(path)
    assert spec.name == "hello"
    assert spec.code == str(tmp_path)
    assert spec.inputs["data"].path == "$AZ_BATCHAI_JOB_MOUNT_ROOT/data"
    assert spec.inputs["abs"].path == "/srv/data"
    assert spec.mounts[0].source == str(tmp_path / "data")


def test_native_errors_name_file_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "command: echo\nnodes: many\n")
    with pytest.raises(SpecError, match=r"job\.yaml: nodes:"):
        load_job_file(path)


def test_detect_format() -> None:
    assert detect_job_format({"nodeCount": 1, "customToolkitSettings": {}}) == "batchai"
    assert detect_job_format({"type": "command", "command": "x"}) == "aml"
    assert detect_job_format({"command": "x"}) == "native"


def test_malformed_json_has_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "job.json", '{\n  "properties": {\n    "nodeCount": 2,\n  }\n}\n')
    with pytest.raises(SpecError, match=r"job\.json: line 4, column 3: invalid JSON"):
        load_job_file(path)


def test_malformed_yaml_has_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "name: x\ncommand: [echo\nnodes: 2\n")
    with pytest.raises(SpecError, match=r"job\.yaml: line \d+, column \d+: invalid YAML") as info:
        load_job_file(path)
    assert info.value.details[0]["line"] >= 2


def test_not_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="mapping"):
        load_job_file(write(tmp_path, "job.yaml", "- a\n- b\n"))
    with pytest.raises(SpecError, match="cannot read"):
        load_job_file(tmp_path / "missing.yaml")


def test_load_job_dict_for_api() -> None:
    spec = load_job_dict({"command": "echo", "code": "rel"}, "request")
    assert spec.code == "rel"
    with pytest.raises(SpecError, match=r"request: .*command is required"):
        load_job_dict({"nodes": 1}, "request")


def test_cluster_files(tmp_path: Path) -> None:
    path = write(tmp_path, "nc6.json", json.dumps({"properties": {
        "vmSize": "Standard_NC6", "scaleSettings": {"manual": {"targetNodeCount": 2}}}}))
    spec = load_cluster_file(path)
    assert (spec.name, spec.vm_size, spec.max_nodes) == ("nc6", "Standard_NC6", 2)
    assert load_cluster_file(path, "other").name == "other"
    native = write(tmp_path, "c.yaml", "name: cpu\nvm_size: Standard_D2_v2\n")
    assert load_cluster_file(native).name == "cpu"
    assert load_cluster_file(native, "renamed").name == "renamed"
