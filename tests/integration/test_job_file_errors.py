"""A job file that is wrong is refused with exit code 2 and one message that names the file
and line or the field; never a traceback. What cannot run here (a Batch AI Key Vault
reference) is refused by name and runs once the user drops it on purpose with `--ignore`."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(90)


def refused(result, *needles: str) -> None:
    assert result.rc == 2, str(result)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, str(result)
    assert "error:" in result.stderr, str(result)
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not named:\n{result}"


def test_bad_yaml_syntax_names_file_and_line(yard):
    path = yard.work / "broken.yaml"
    path.write_text("name: broken\nnodes: 2\ncommand: [echo, hi\ndistribution:\n  type: mpi\n")
    result = yard.cli("job", "create", "-f", str(path), "-c", "local2")
    refused(result, "broken.yaml", "line 4", "YAML")


def test_unknown_field_is_named(yard):
    path = yard.work / "unknown.yaml"
    path.write_text("name: unknown\nnodez: 2\ncommand: echo hi\n")
    refused(yard.cli("job", "create", "-f", str(path)), "unknown.yaml", "nodez",
            "unknown field")


def test_unknown_nested_field_names_its_path(yard):
    path = yard.work / "nested.yaml"
    path.write_text("command: echo hi\ndistribution:\n  type: pytorch\n  proceses_per_node: 2\n")
    refused(yard.cli("job", "create", "-f", str(path)), "distribution.proceses_per_node")


def test_bad_value_names_the_field(yard):
    path = yard.work / "zero.yaml"
    path.write_text("name: zero\nnodes: 0\ncommand: echo hi\n")
    refused(yard.cli("job", "create", "-f", str(path)), "zero.yaml", "nodes")


def test_missing_file(yard):
    refused(yard.cli("job", "create", "-f", str(yard.work / "nope.yaml")), "nope.yaml")


def test_nothing_was_submitted(yard):
    # none of the refused files above reached the server
    assert yard.js("job", "list") == []


BATCHAI_JOB = {
    "$schema": "https://raw.githubusercontent.com/Azure/BatchAI/master/schemas/2018-05-01/"
               "job.json",
    "properties": {
        "nodeCount": 1,
        "customToolkitSettings": {"commandLine": "echo hi from $AZ_BATCHAI_TASK_INDEX"},
        "secrets": [{"name": "TOKEN", "keyVaultSecretReference": {
            "sourceVault": {"id": "/subscriptions/x/resourceGroups/g/providers/"
                                  "Microsoft.KeyVault/vaults/v"},
            "secretUrl": "https://v.vault.azure.net/secrets/token"}}],
    },
}


def test_batchai_key_vault_secret_refused_then_ignored(yard, cluster2):
    path = yard.work / "job.json"
    path.write_text(json.dumps(BATCHAI_JOB, indent=2))
    refused(yard.cli("job", "create", "-f", str(path), "-n", "bai", "-c", cluster2),
            "secrets[0].keyVaultSecretReference", "--ignore secrets[0].keyVaultSecretReference")
    run = yard.cli("job", "create", "-f", str(path), "-n", "bai", "-c", cluster2,
                   "--ignore", "secrets", "--wait")
    assert run.rc == 0, str(run)
    assert "hi from 0" in run.stdout, str(run)
    job = yard.js("job", "show", "-n", "bai")
    assert job["state"] == "succeeded" and job["source_format"] == "batchai"
    assert job["nodes"] == 1 and job["distribution"] == "custom"
