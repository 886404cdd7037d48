"""Seed 000's cluster options and the AML compat's datastore registration, through the real
CLI and server, against a real Azurite: ``cluster create --use-auto-storage -i UbuntuLTS``
(the workspace's default datastore at ``$AZ_BATCHAI_MOUNT_ROOT/autobfs`` and ``autoafs`` in
every job of the cluster, a local directory or a registered Azure Blob datastore), the admin
account options said to be unused rather than dropped, and
``Datastore.register_azure_blob_container`` / ``register_azure_file_share``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import strictkit
from batchyard.compat.azureml.core import Datastore
from batchyard.compat.azureml.core.workspace import Workspace
from batchyard.compat.azureml.exceptions import UnsupportedParameterError, UserErrorException
from batchyard.sdk import set_default_client
from storagekit import AzuriteServer, azurite, azurite_available
from yardkit import Yard

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow,
              strictkit.requires(not azurite_available(), "azurite is not installed "
                                 "(scripts/setup.sh installs it with npm)")]

PASSWORD = "Sup3r-Secret-pw"
READ_AUTO = """\
import os, pathlib
root = pathlib.Path(os.environ["AZ_BATCHAI_MOUNT_ROOT"])
print("bfs:", (root / "autobfs" / "hello.txt").read_text().strip(), flush=True)
(root / "autoafs" / "from-job.txt").write_text("written by " + os.environ["BATCHYARD_JOB_NAME"])
"""


@pytest.fixture(scope="module")
def az(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    with azurite(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture(scope="module")
def ws(yard: Yard) -> Iterator[Workspace]:
    """The AML compat, as a notebook uses it, on this yard's server."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHYARD_HOME", str(yard.home))
        for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN", "BATCHYARD_API",
                    "BATCHYARD_DATA_ROOT"):
            mp.delenv(key, raising=False)
        set_default_client(None)
        yield Workspace.create(name="amlws", exist_ok=True, show_output=False)
        set_default_client(None)


def _job(yard: Yard, name: str, cluster: str, workspace: str = "default") -> dict[str, Any]:
    path = yard.write_job(name, {"name": name, "code": ".", "command": "python read.py"},
                          files={"read.py": READ_AUTO})
    run = yard.cli("job", "create", "-f", str(path), "-c", cluster, "-w", workspace,
                   "--wait", timeout=240)
    job = yard.js("job", "show", "-n", name, "-w", workspace)
    logs = yard.cli("job", "logs", "-n", name, "-w", workspace).stdout
    assert run.rc == 0 and job["state"] == "succeeded", (str(run), logs)
    return {**job, "logs": logs}


def test_cluster_create_batchai_node_options(yard: Yard) -> None:
    """-i takes Batch AI's aliases (recorded, with a note); -u/-p/-k are said to be unused;
    the password is shown and stored nowhere."""
    run = yard.cli("cluster", "create", "-n", "auto", "-g", "batchai.recipes", "-s",
                   "Standard_D2_v2", "-t", "1", "--use-auto-storage", "-i", "UbuntuLTS",
                   "-u", "admin", "-p", PASSWORD,
                   "-k", "ssh-rsa AAAAB3Nza", "--generate-ssh-keys", "-o", "json")
    assert run.rc == 0, str(run)
    assert "--user-name, --password, --ssh-key not used" in run.stderr
    assert "jobs run as an unprivileged uid of their submitter" in run.stderr
    assert "UbuntuLTS (Canonical:UbuntuServer:16.04-LTS) is recorded, not installed" \
        in run.stderr
    shown = yard.js("cluster", "show", "auto")
    assert json.dumps(shown).count(PASSWORD) == 0 and PASSWORD not in run.stdout
    assert shown["auto_storage"] is True and shown["image"] == "UbuntuLTS"
    table = yard.ok("cluster", "show", "auto").stdout
    assert "autobfs" in table and "UbuntuLTS (recorded" in table
    raw = yard.http.get("/workspaces/default/clusters/auto").text
    assert PASSWORD not in raw and PASSWORD not in (yard.home / "batchyard.db").read_bytes(
        ).decode("latin-1")

    bad = yard.cli("cluster", "create", "-n", "win", "-s", "Standard_D2_v2", "-i", "Win2016")
    assert bad.rc == 2 and "--image" in bad.stderr and "UbuntuLTS, UbuntuDSVM" in bad.stderr
    assert "Traceback" not in bad.stderr
    urn = yard.cli("cluster", "create", "-n", "urn", "-s", "Standard_D2_v2", "-t", "0", "-i",
                   "microsoft-ads:linux-data-science-vm-ubuntu:linuxdsvmubuntu:latest")
    assert urn.rc == 0, str(urn)


def test_cluster_json_user_account_settings_warns(yard: Yard) -> None:
    path = yard.work / "cluster.json"
    path.write_text(json.dumps({"properties": {
        "vmSize": "Standard_D2_v2", "scaleSettings": {"manual": {"targetNodeCount": 0}},
        "userAccountSettings": {"adminUserName": "demo", "adminUserPassword": PASSWORD}}}))
    run = yard.cli("cluster", "create", "-n", "fromjson", "-f", str(path))
    assert run.rc == 0, str(run)
    assert "userAccountSettings not used" in run.stderr and PASSWORD not in run.stderr


def test_auto_storage_local_default_datastore(yard: Yard, ws: Workspace) -> None:
    """No datastore registered: autobfs/autoafs are the workspace's default directories,
    autobfs the one ``ws.get_default_datastore()`` uploads into."""
    src = yard.work / "auto-src"
    src.mkdir()
    (src / "hello.txt").write_text("hello from the default datastore\n")
    default = Datastore.get_default(Workspace(workspace_name="default"))
    default.upload(str(src), overwrite=True, show_progress=False)
    yard.wait_cluster("auto", 1)
    job = _job(yard, "auto-local", "auto")
    assert "bfs: hello from the default datastore" in job["logs"]
    share = Path(default.root).parent / "workspacefilestore" / "from-job.txt"
    assert share.read_text() == "written by auto-local"


def test_register_azure_blob_container(yard: Yard, ws: Workspace, az: AzuriteServer,
                                       tmp_path: Path) -> None:
    fs: Any = az.fs()
    fs.mkdir("scripts")
    with pytest.raises(UserErrorException, match="container 'nosuch' does not exist"):
        Datastore.register_azure_blob_container(ws, "missing", "nosuch", az.account,
                                                account_key=az.key, endpoint=az.endpoint)
    store = Datastore.register_azure_blob_container(
        ws, datastore_name="scripts", container_name="scripts", account_name=az.account,
        account_key=az.key, endpoint=az.endpoint)
    assert (store.datastore_type, store.container_name, store.account_name) == \
        ("AzureBlob", "scripts", az.account)
    with pytest.raises(UserErrorException, match=r"already exists.*overwrite=True"):
        Datastore.register_azure_blob_container(ws, "scripts", "scripts", az.account,
                                                account_key=az.key, endpoint=az.endpoint)
    src = tmp_path / "src"
    (src / "chainer").mkdir(parents=True)
    payload = os.urandom(70_000)
    (src / "chainer" / "train_mnist.py").write_bytes(payload)
    (src / "jobprep.sh").write_text("echo prep\n")
    store.upload(str(src), target_path="recipes", show_progress=False)
    assert fs.cat_file("scripts/recipes/chainer/train_mnist.py") == payload  # in Azurite
    again = Datastore.get(ws, "scripts")
    dest = tmp_path / "dest"
    assert again.download(str(dest), prefix="recipes", show_progress=False) == 2
    assert (dest / "recipes" / "chainer" / "train_mnist.py").read_bytes() == payload
    assert ws.datastores["scripts"].datastore_type == "AzureBlob"
    assert "workspaceblobstore" in ws.datastores
    with pytest.raises(UnsupportedParameterError, match="datastore://scripts/"):
        again.path("recipes")
    # the CLI sees the same datastore; the key is sealed on the server, never shown
    listed = yard.cli("datastore", "list", "-w", "amlws", "-o", "json")
    assert az.key not in listed.stdout
    row = next(d for d in json.loads(listed.stdout) if d["name"] == "scripts")
    assert row["kind"] == "azure_blob" and row["credentials"] == ["account_key"]
    replaced = Datastore.register_azure_blob_container(
        ws, "scripts", "scripts2", az.account, account_key=az.key, endpoint=az.endpoint,
        overwrite=True, create_if_not_exists=True)
    assert replaced.container_name == "scripts2" and fs.exists("scripts2")
    replaced.unregister()
    with pytest.raises(UserErrorException, match="not found"):
        Datastore.get(ws, "scripts")


def test_register_azure_file_share(yard: Yard, ws: Workspace, az: AzuriteServer) -> None:
    share = Datastore.register_azure_file_share(
        ws, "logs", file_share_name="logs", account_name=az.account, account_key=az.key,
        endpoint=az.endpoint, create_if_not_exists=True)
    assert share.datastore_type == "AzureFile" and share.container_name == "logs"
    shown = yard.js("datastore", "show", "logs", "-w", "amlws")
    assert shown["maps_url"] == [f"https://{az.account}.file.core.windows.net/logs"]


def test_auto_storage_on_a_registered_blob_default(yard: Yard, ws: Workspace,
                                                   az: AzuriteServer) -> None:
    """workspaceblobstore registered on Azure Blob: autobfs shows that container."""
    fs: Any = az.fs()
    fs.mkdir("batchaicontainer")
    fs.pipe_file("batchaicontainer/hello.txt", b"hello from azurite\n")
    Datastore.register_azure_blob_container(ws, "workspaceblobstore", "batchaicontainer",
                                            az.account, account_key=az.key,
                                            endpoint=az.endpoint)
    assert Datastore.get_default(ws).datastore_type == "AzureBlob"
    yard.ok("cluster", "create", "-n", "autoblob", "-w", "amlws", "-s", "Standard_D2_v2",
            "-t", "1", "--use-auto-storage")
    yard.wait_cluster("autoblob", 1, workspace="amlws")
    job = _job(yard, "auto-blob", "autoblob", workspace="amlws")
    assert "bfs: hello from azurite" in job["logs"]
    assert az.key not in job["logs"]
