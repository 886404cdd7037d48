"""The pure parts of node/fuse.py and node/nfs.py: the SAS rclone gets for an account key
(checked against the Azure SDK's own signer), where secrets go (environment, never the
remote string), what counts as a stale mount of an attempt, and NFS mount command lines."""

from __future__ import annotations

import base64
import datetime
import os
import urllib.parse
from pathlib import Path

import pytest

from batchyard.node import fuse, nfs
from batchyard.storage.stores import make_store


def test_container_sas_matches_the_azure_sdk() -> None:
    from azure.storage.blob._shared_access_signature import BlobSharedAccessSignature

    key = base64.b64encode(os.urandom(32)).decode()
    expiry = 1900000000.0
    signer = BlobSharedAccessSignature("acct", key)
    signer.x_ms_version = fuse.SAS_VERSION
    theirs = signer.generate_container(
        "cont", permission="racwdl", expiry=datetime.datetime.fromtimestamp(
            expiry, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    ours = fuse.container_sas("acct", key, "cont", expiry)
    assert dict(urllib.parse.parse_qsl(ours)) == dict(urllib.parse.parse_qsl(theirs))


def test_azure_secrets_travel_in_the_environment_only() -> None:
    key = base64.b64encode(b"k" * 32).decode()
    store = make_store("azure_blob", "data/sub", label="x", account_name="acct",
                       endpoint="http://127.0.0.1:10000/acct",
                       credentials={"account_key": key})
    remote, env = fuse.remote_of(store, 1900000000.0)
    assert remote == ":azureblob:data/sub"
    url = env["RCLONE_AZUREBLOB_SAS_URL"]
    assert url.startswith("http://127.0.0.1:10000/acct/data?") and "sig=" in url
    assert key not in url and key not in remote
    sas = make_store("azure_blob", "c", label="x", account_name="acct",
                     credentials={"sas_token": "?sv=1&sig=abc"})
    assert fuse.remote_of(sas, 0)[1]["RCLONE_AZUREBLOB_SAS_URL"] == (
        "https://acct.blob.core.windows.net/c?sv=1&sig=abc")


def test_s3_remote_and_environment() -> None:
    store = make_store("s3", "models/run", label="x", endpoint="http://127.0.0.1:9000",
                       credentials={"access_key_id": "AK", "secret_access_key": "SK"})
    remote, env = fuse.remote_of(store, 0)
    assert remote == ":s3:models/run"
    assert env == {"RCLONE_S3_PROVIDER": "Other", "RCLONE_S3_ENV_AUTH": "false",
                   "RCLONE_S3_ENDPOINT": "http://127.0.0.1:9000",
                   "RCLONE_S3_ACCESS_KEY_ID": "AK", "RCLONE_S3_SECRET_ACCESS_KEY": "SK"}


def test_what_rclone_can_mount() -> None:
    assert fuse.not_mountable(make_store("s3", "b", label="x")) is None
    assert fuse.not_mountable(make_store("local", "/d", label="x"))
    anonymous = make_store("azure_blob", "c", label="x", account_name="a")
    assert "no account key" in str(fuse.not_mountable(anonymous))
    conn = make_store("azure_blob", "c", label="x", credentials={
        "connection_string": "AccountName=a;AccountKey=eHg=;BlobEndpoint=http://h:1/a"})
    assert fuse.not_mountable(conn) is None
    assert fuse.remote_of(conn, 0)[1]["RCLONE_AZUREBLOB_SAS_URL"].startswith("http://h:1/a/c?")


def test_no_fuse_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHYARD_NO_FUSE", "1")
    assert fuse.unavailable() == "BATCHYARD_NO_FUSE is set on this node"
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("BATCHYARD_NO_FUSE")
    assert fuse.unavailable() in ("no /dev/fuse on this node",
                                  "rclone is not installed on this node")


def test_stale_targets_are_those_of_the_tag(tmp_path: Path) -> None:
    table = tmp_path / "mounts"
    table.write_text(
        "batchyard:u1/0:0 /n/jobs/j-u1/inputs/DATA fuse.rclone ro 0 0\n"
        "batchyard:u1/1:0 /n1/jobs/j-u1/inputs/DATA fuse.rclone ro 0 0\n"
        "batchyard:u10/0:0 /x fuse.rclone rw 0 0\n"
        "batchyard:u1/0:1 /n/with\\040space fuse.rclone rw 0 0\n"
        "/dev/sda / ext4 rw 0 0\n")
    assert fuse.stale_targets("u1/0", str(table)) == ["/n/jobs/j-u1/inputs/DATA",
                                                      "/n/with space"]


def test_nfs_sources_and_command_line(tmp_path: Path) -> None:
    assert nfs.split_source("10.0.0.4:/export/data") == ("10.0.0.4", "/export/data")
    assert nfs.split_source("[fd00::4]:/e") == ("fd00::4", "/e")
    for bad in ("/export", "host:export", ":/e"):
        with pytest.raises(ValueError):
            nfs.split_source(bad)
    target = tmp_path / "m"
    assert nfs.mount_argv("h:/e", target, None) == ["mount", "-t", "nfs", "-o", "vers=4",
                                                     "h:/e", str(target)]
    assert nfs.mount_argv("h:/e", target, "vers=3, ro")[4] == "vers=3,ro"
    assert nfs.mount_argv("h:/e", target, "ro,hard")[4] == "vers=4,ro,hard"
