"""The rest of a newcomer's CLI frictions (issue 14), through the real server: `cluster create
--wait` follows the nodes until they are idle, a GPU size on a GPU-less host says its nodes
offer 0 GPUs, a pending reason names the jobs holding the nodes, and `datastore register`
checks the container and the credentials (`--no-verify` to skip), an upload into a missing
container is a 4xx naming it, against a real Azurite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import strictkit
from batchyard.backends.local import host_gpus
from storagekit import AzuriteServer, azurite, azurite_available
from yardkit import Yard, wait_until


def test_cluster_create_wait_returns_with_idle_nodes(yard: Yard) -> None:
    result = yard.ok("cluster", "create", "-n", "waited", "-s", "Standard_D2_v2", "-t", "2",
                     "--provisioning-delay", "1.5", "--wait", "-o", "json")
    data = result.json()
    assert data["node_counts"].get("idle") == 2, data
    assert "cluster waited: " in result.stderr  # progress lines (stderr is not a terminal)
    assert "cluster waited is ready: 2 idle" in result.stderr, result.stderr


def test_cluster_create_wait_gives_up_after_its_timeout(yard: Yard) -> None:
    result = yard.cli("cluster", "create", "-n", "slowgrow", "-s", "Standard_D2_v2", "-t", "1",
                      "--provisioning-delay", "30", "--wait", "--timeout", "2")
    assert result.rc == 1, str(result)
    assert "not ready after 2s" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(bool(host_gpus()), reason="this machine has GPUs")
def test_a_gpu_size_on_a_gpu_less_host_warns(yard: Yard) -> None:
    result = yard.ok("cluster", "create", "-n", "nc6", "-s", "Standard_NC6", "-t", "1")
    assert "Standard_NC6 has 1 GPU(s) per node, but this machine has no GPU" in result.stderr
    assert "offer 0 GPUs" in result.stderr
    plain = yard.ok("cluster", "create", "-n", "d2", "-s", "Standard_D2_v2", "-t", "1")
    assert "GPU" not in plain.stderr


def test_a_pending_reason_names_the_jobs_holding_the_nodes(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "held", "-s", "Standard_D2_v2", "-t", "1", "--wait")
    marker = yard.work / "release-holder"
    holder = yard.write_job("holder", {"name": "holder", "cluster": "held",
                                       "command": f"until [ -e {marker} ]; do sleep 0.1; done"})
    waiter = yard.write_job("waiter", {"name": "waiter", "cluster": "held", "command": "true"})
    yard.ok("job", "create", "-f", str(holder))
    yard.wait_job("holder", ("running",), timeout=60)
    yard.ok("job", "create", "-f", str(waiter))
    reason = wait_until(lambda: "held by" in (r := yard.job("waiter").get("pending_reason")
                                              or "") and r, 30, what="a pending reason")
    assert "held by holder" in reason, reason
    marker.touch()
    assert yard.wait_job("waiter", timeout=120)["state"] == "succeeded"


@pytest.fixture(scope="module")
def blob(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    if not azurite_available():
        strictkit.missing("Azurite is not installed (scripts/setup.sh)")
    with azurite(tmp_path_factory.mktemp("azurite")) as server:
        server.fs().mkdir("present")
        yield server


def _register(yard: Yard, az: AzuriteServer, name: str, container: str, key: str,
              *extra: str) -> tuple[int, str]:
    result = yard.cli("datastore", "register", name, "--kind", "azure_blob",
                      "--account-name", az.account, "--container", container,
                      "--endpoint", az.endpoint, "--account-key", key, *extra)
    return result.rc, result.stdout + result.stderr


def test_datastore_register_checks_the_container_and_the_key(yard: Yard,
                                                             blob: AzuriteServer) -> None:
    rc, out = _register(yard, blob, "ok1", "present", blob.key)
    assert rc == 0, out
    rc, out = _register(yard, blob, "nope", "absent", blob.key)
    assert rc == 3 and "container 'absent' not found" in out and "--no-verify" in out, out
    wrong = "A" * len(blob.key)
    rc, out = _register(yard, blob, "badkey", "present", wrong)
    assert rc == 2 and "cannot open container 'present'" in out, out
    assert wrong not in out and blob.key not in out
    listed = yard.js("datastore", "list", "-o", "json")
    assert {d["name"] for d in listed} >= {"ok1"}
    assert not {"nope", "badkey"} & {d["name"] for d in listed}
    rc, out = _register(yard, blob, "later", "absent", blob.key, "--no-verify")
    assert rc == 0, out


def test_an_upload_into_a_missing_container_names_it(yard: Yard, blob: AzuriteServer,
                                                     tmp_path: Path) -> None:
    rc, out = _register(yard, blob, "unmade", "not-made-yet", blob.key, "--no-verify")
    assert rc == 0, out
    source = tmp_path / "f.txt"
    source.write_text("hello\n")
    result = yard.cli("datastore", "upload", "unmade", str(source), "--target-path", "x/f.txt")
    assert result.rc in (2, 3), str(result)
    assert "not-made-yet" in result.stderr and "internal error" not in result.stderr
