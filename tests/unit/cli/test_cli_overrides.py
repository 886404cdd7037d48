"""`job create` overrides (`--set`, `--env`, `--tag`, `--nodes`, `--processes-per-node`,
`--priority`) on a loaded native spec, and `--ignore` checked against what a file refuses;
no server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchyard.cli import overrides
from batchyard.cli.job_create import _check_ignores, refused_properties
from batchyard.errors import UserError
from batchyard.spec.job import JobSpec
from batchyard.spec.loader import load_job_file


def loaded(**fields: Any) -> dict[str, Any]:
    spec = {"command": "python train.py", "nodes": 2,
            "distribution": {"type": "pytorch", "processes_per_node": 2},
            "env": {"KEEP": "1"}, **fields}
    return JobSpec.model_validate(spec).model_dump(mode="json", exclude_none=True)


def test_dotted_paths_and_yaml_scalars() -> None:
    doc = overrides.apply(loaded(), sets=[
        "distribution.processes_per_node=3", "limits.max_wall_clock=2h", "env.SEED=007",
        "tags.run=a", "outputs.MODEL={}", "limits.retry_exit_codes=[3, 4]"])
    spec = JobSpec.model_validate(doc)
    assert spec.distribution.processes_per_node == 3
    assert spec.limits.max_wall_clock == 7200
    assert spec.env == {"KEEP": "1", "SEED": "007"}  # env values stay text
    assert spec.tags == {"run": "a"} and "MODEL" in spec.outputs
    assert spec.limits.retry_exit_codes == [3, 4]


def test_a_field_that_wants_text_gets_the_text() -> None:
    doc = overrides.apply(loaded(), sets=["command=true", "name=2024"])
    assert doc["command"] == "true" and doc["name"] == "2024"


def test_empty_value_removes_the_setting() -> None:
    doc = overrides.apply(loaded(limits={"max_wall_clock": "1h"}),
                          sets=["limits.max_wall_clock="])
    assert JobSpec.model_validate(doc).limits.max_wall_clock is None


def test_list_items_by_index() -> None:
    doc = overrides.apply(loaded(mounts=[{"relative_path": "data", "source": "/a"}]),
                          sets=["mounts[0].source=/b", "distribution.mpirun_args=[-x, A]"])
    assert doc["mounts"][0]["source"] == "/b"
    assert doc["distribution"]["mpirun_args"] == ["-x", "A"]


def test_named_options_win_and_apply_after_set() -> None:
    doc = overrides.apply(loaded(), sets=["nodes=5"], env=["A=x=y", "KEEP=2"],
                          tags=["team=ml"], nodes=1, processes_per_node=4, priority="high")
    spec = JobSpec.model_validate(doc)
    assert spec.nodes == 1 and spec.distribution.processes_per_node == 4
    assert spec.priority == "high" and spec.tags == {"team": "ml"}
    assert spec.env == {"KEEP": "2", "A": "x=y"}


def test_the_original_is_left_alone() -> None:
    doc = loaded()
    overrides.apply(doc, sets=["nodes=9"], env=["X=1"])
    assert doc["nodes"] == 2 and doc["env"] == {"KEEP": "1"}


@pytest.mark.parametrize(("item", "needles"), [
    ("distribution.proceses_per_node=2", ["--set distribution.proceses_per_node=2",
                                          "distribution.proceses_per_node", "unknown field"]),
    ("nodez=2", ["nodez", "unknown field"]),
    ("command.shell=bash", ["--set command.shell", "command is", "not a mapping"]),
    ("mounts[0].source=/x", ["--set mounts[0].source", "0 item"]),
    ("env[0]=x", ["--set env[0]", "mapping, not a list"]),
    ("nodes=two", ["--set nodes=two", "nodes", "integer"]),
    ("priority=urgent", ["priority", "'low', 'normal' or 'high'"]),
    ("nodes", ["PATH=VALUE"]),
    ("=2", ["PATH=VALUE"]),
    ("a..b=1", ["--set a..b"]),
])
def test_bad_paths_and_values_name_the_path(item: str, needles: list[str]) -> None:
    with pytest.raises(UserError) as caught:
        overrides.apply(loaded(), sets=[item])
    for needle in needles:
        assert needle in caught.value.message, caught.value.message


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"env": ["NOVALUE"]}, "--env 'NOVALUE': give KEY=VALUE"),
    ({"tags": ["=x"]}, "--tag '=x': give KEY=VALUE"),
    ({"priority": "urgent"}, "priority"),
    ({"nodes": 0}, "nodes"),
    ({"processes_per_node": 0}, "distribution.processes_per_node"),
])
def test_bad_named_overrides(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(UserError) as caught:
        overrides.apply(loaded(), **kwargs)
    assert needle in caught.value.message, caught.value.message


def test_parse_path() -> None:
    assert overrides.parse_path("mounts[0].source") == ["mounts", 0, "source"]
    assert overrides.parse_path("mounts.1.source") == ["mounts", 1, "source"]
    assert overrides.parse_path("distribution.processes_per_node") == \
        ["distribution", "processes_per_node"]


def _batchai(tmp_path: Path) -> Path:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"properties": {
        "nodeCount": 1, "customToolkitSettings": {"commandLine": "echo hi"},
        "stdOutErrPathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/logs",
        "mountVolumes": {"fileServers": [{"fileServer": {
            "id": "/subscriptions/x/resourceGroups/g/providers/Microsoft.BatchAI/fileServers/f"},
            "relativeMountPath": "nfs"}]},
        "secrets": [{"name": "K", "keyVaultSecretReference": {
            "sourceVault": {"id": "/subscriptions/x"}, "secretUrl": "https://v/s"}}]}}))
    return path


def test_refused_properties_of_a_batchai_file(tmp_path: Path) -> None:
    path = _batchai(tmp_path)
    found = refused_properties(lambda dropped: load_job_file(path, ignore=dropped))
    assert found == ["secrets[0].keyVaultSecretReference", "mountVolumes.fileServers[0]"]
    _check_ignores("job.json", ["mountVolumes", "properties.secrets"], found)  # fine


def test_ignore_of_something_not_refused_names_what_can_be(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    import typer

    found = refused_properties(lambda dropped: load_job_file(_batchai(tmp_path),
                                                             ignore=dropped))
    with pytest.raises(typer.Exit) as caught:
        _check_ignores("job.json", ["no_such_property"], found)
    assert caught.value.exit_code == 2
    err = capsys.readouterr().err
    assert "--ignore no_such_property" in err
    assert "mountVolumes.fileServers[0]" in err and "secrets[0].keyVaultSecretReference" in err

    with pytest.raises(typer.Exit):
        _check_ignores("job.yaml", ["mountVolumes"], [])
    assert "nothing in job.yaml is refused" in capsys.readouterr().err
