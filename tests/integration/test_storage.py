"""Storage against real emulators: Azurite (Azure Blob) and moto's S3 server on loopback.

A 2-node job reads a dataset from Azure Blob in `download` and `ro_mount` mode (a FUSE
mount through rclone; test_mounts.py covers mounts and their fallback) and writes its model
to S3 in `upload` mode; the files are checked byte for byte. A Batch AI job.json carrying an
`accountKey` mounts blob containers; the key must appear in no API response, CLI output, log
file or database file. Failures name the mount or input and the cause."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import strictkit
from storagekit import AzuriteServer, MotoServer, azurite, azurite_available, moto_s3
from yardkit import Yard

pytestmark = strictkit.requires(not azurite_available(), "azurite is not installed "
                                "(scripts/setup.sh installs it with npm)")

# a stage-in line: "input DATA <- az://...: 3 file(s), 0 B transferred, 812 B from cache, ..."
STAGED = re.compile(r"^\S+ input \w+ <- .*?: \d+ file\(s\), (\d+) B transferred, "
                    r"(\d+) B from cache", re.M)

TRAIN = '''
import hashlib, os, pathlib
rank = int(os.environ["RANK"])
out = pathlib.Path(os.environ["BATCHYARD_OUTPUT_MODEL"])
out.mkdir(parents=True, exist_ok=True)
lines = []
for ident in ("DATA", "DATAMNT"):
    root = pathlib.Path(os.environ["AZ_BATCHAI_INPUT_" + ident])
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{ident} {path.relative_to(root)} {digest}")
(out / f"manifest-rank{rank}.txt").write_text("\\n".join(lines) + "\\n")
(out / f"weights-rank{rank}.bin").write_bytes(bytes(range(256)) * 4096 + bytes([rank]))
'''


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AzuriteServer,
                                                                      MotoServer]]:
    with azurite(tmp_path_factory.mktemp("azurite")) as az, moto_s3() as s3:
        yield az, s3


@pytest.fixture(scope="module")
def dataset(servers: tuple[AzuriteServer, MotoServer]) -> dict[str, bytes]:
    az, s3 = servers
    fs: Any = az.fs()
    fs.mkdir("datasets")
    files = {f"mnist/part-{i:02d}.bin": os.urandom(5000 + 37 * i) for i in range(12)}
    files["mnist/labels/labels.txt"] = b"0 1 2 3 4 5 6 7 8 9\n"
    for rel, data in files.items():
        fs.pipe_file(f"datasets/{rel}", data)
    s3fs: Any = s3.fs()
    s3fs.mkdir("models")
    return files


def _register(yard: Yard, az: AzuriteServer, s3: MotoServer) -> None:
    yard.ok("datastore", "register", "blobdata", "--kind", "azure_blob", "--account-name",
            az.account, "--container", "datasets", "--endpoint", az.endpoint,
            "--account-key", az.key)
    yard.ok("datastore", "register", "models", "--kind", "s3", "--bucket", "models",
            "--endpoint", s3.endpoint, "--access-key-id", s3.key_id,
            "--secret-access-key", s3.secret)


@pytest.fixture(scope="module")
def stores(yard: Yard, servers: tuple[AzuriteServer, MotoServer],
           dataset: dict[str, bytes]) -> tuple[AzuriteServer, MotoServer]:
    az, s3 = servers
    _register(yard, az, s3)
    return az, s3


def test_datastore_cli_never_shows_credentials(yard: Yard, stores: Any) -> None:
    az, s3 = stores
    listed = yard.cli("datastore", "list", "-o", "json")
    shown = yard.cli("datastore", "show", "blobdata", "-o", "json")
    table = yard.cli("datastore", "list")
    for result in (listed, shown, table):
        assert result.rc == 0, str(result)
        assert az.key not in result.stdout + result.stderr
        assert s3.secret not in result.stdout + result.stderr
    assert json.loads(shown.stdout)["credentials"] == ["account_key"]
    raw = yard.http.get("/workspaces/default/datastores/models").text
    assert s3.secret not in raw and "secret_access_key" in raw  # the name, not the value


def test_datastore_upload_download_roundtrip(yard: Yard, stores: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(3 << 20))
    (src / "d" / "b.txt").write_text("hello")
    up = yard.js("datastore", "upload", "models", str(src), "--target-path", "roundtrip")
    assert up["files"] == 2
    dest = tmp_path / "dest"
    down = yard.js("datastore", "download", "models", str(dest), "--prefix", "roundtrip")
    assert down["files"] == 2
    assert (dest / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert (dest / "d" / "b.txt").read_text() == "hello"


def test_two_node_job_blob_inputs_s3_outputs(yard: Yard, cluster2: str, stores: Any,
                                             dataset: dict[str, bytes]) -> None:
    _az, s3 = stores
    job_file = yard.write_job("train", {
        "name": "train", "nodes": 2, "distribution": {"type": "pytorch",
                                                      "processes_per_node": 1},
        "code": ".", "command": "python train.py",
        "inputs": {"DATA": {"path": "azureml://datastores/blobdata/paths/mnist",
                            "mode": "download"},
                   "DATAMNT": {"path": "az://datasets/mnist/labels", "mode": "ro_mount"}},
        "outputs": {"MODEL": {"datastore": "models", "mode": "upload"}},
    }, files={"train.py": TRAIN})
    run = yard.cli("job", "create", "-f", str(job_file), "-c", cluster2, "--wait",
                   timeout=180)
    assert run.rc == 0, str(run)
    job = yard.job("train")
    assert job["state"] == "succeeded", job
    expected = [f"DATA {rel.removeprefix('mnist/')} {hashlib.sha256(data).hexdigest()}"
                for rel, data in sorted(dataset.items())]
    labels = hashlib.sha256(dataset["mnist/labels/labels.txt"]).hexdigest()
    expected += [f"DATAMNT labels.txt {labels}"]
    s3fs: Any = s3.fs()
    for rank in range(2):
        manifest = s3fs.cat_file(f"models/default/train/model/manifest-rank{rank}.txt")
        assert manifest.decode().splitlines() == sorted(expected[:-1]) + expected[-1:]
        weights = s3fs.cat_file(f"models/default/train/model/weights-rank{rank}.bin")
        assert weights == bytes(range(256)) * 4096 + bytes([rank])
    attempt = yard.attempt_dir(job)
    log = (attempt / "stdouterr" / "local2-0-launcher.txt").read_text()
    assert "input DATAMNT: FUSE mount (rclone, read-only)" in log, log


def test_rerun_uses_the_node_cache(yard: Yard, cluster2: str, stores: Any) -> None:
    job_file = yard.work / "jobs" / "train" / "job.yaml"
    run = yard.cli("job", "create", "-f", str(job_file), "-c", cluster2, "-n", "train2",
                   "--wait", timeout=180)
    assert run.rc == 0, str(run)
    attempt = yard.attempt_dir(yard.job("train2"))
    for node in ("local2-0", "local2-1"):  # each node's stage-in log, as the server got it
        log = (attempt / "stdouterr" / f"{node}-stagein.stdout.txt").read_text()
        moved = [(int(m[1]), int(m[2])) for m in STAGED.finditer(log)]
        assert len(moved) == 1, log  # the download-mode input (the other one is mounted)
        assert all(transferred == 0 for transferred, _ in moved), log
        assert sum(cached for _, cached in moved) > 0, log


def _batchai_job(az: AzuriteServer, key: str, container: str = "scripts") -> dict[str, Any]:
    return {"properties": {
        "nodeCount": 1,
        "customToolkitSettings": {"commandLine":
                                  "cat $AZ_BATCHAI_JOB_MOUNT_ROOT/scripts/run.sh && "
                                  "bash $AZ_BATCHAI_JOB_MOUNT_ROOT/scripts/run.sh"},
        "stdOutErrPathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/logs",
        "mountVolumes": {
            "azureFileShares": [{"azureFileUrl": f"https://{az.account}.file.core.windows.net/"
                                 "logs", "relativeMountPath": "logs"}],
            "azureBlobFileSystems": [
                {"accountName": az.account, "containerName": container,
                 "credentials": {"accountKey": key}, "relativeMountPath": "scripts"},
                {"accountName": az.account, "containerName": "result",
                 "credentials": {"accountKey": key}, "relativeMountPath": "result"}]},
        "outputDirectories": [{"id": "MODEL", "pathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/result"}],
    }}


def test_batchai_blob_mounts_and_key_never_leaks(yard: Yard, cluster2: str, stores: Any,
                                                 tmp_path: Path) -> None:
    az, _s3 = stores
    fs: Any = az.fs()
    for container in ("scripts", "result"):
        fs.mkdir(container)
    fs.pipe_file("scripts/run.sh", b"echo trained > $AZ_BATCHAI_OUTPUT_MODEL/model.txt\n"
                 b"echo rank-log-line\n")
    missing = yard.cli("job", "create", "-f", str(_write(tmp_path, _batchai_job(az, az.key))),
                       "-n", "seedlike", "-c", cluster2)
    assert missing.rc == 2 and "logs" in missing.stderr and "--maps-url" in missing.stderr
    logs = tmp_path / "logs-share"
    logs.mkdir()
    yard.ok("datastore", "register", "logs", "--kind", "local", "--path", str(logs),
            "--maps-url", f"https://{az.account}.file.core.windows.net/logs")
    run = yard.cli("job", "create", "-f", str(_write(tmp_path, _batchai_job(az, az.key))),
                   "-n", "seedlike", "-c", cluster2, "--wait", timeout=120)
    assert run.rc == 0, str(run)
    outputs = [p for p in fs.find("result") if p.endswith("model.txt")]
    assert len(outputs) == 1 and fs.cat_file(outputs[0]) == b"trained\n"
    assert list(logs.rglob("*rank0.stdout.txt")), "rank logs land in the mapped share"
    shown = yard.cli("job", "show", "-n", "seedlike", "-o", "json")
    table = yard.cli("job", "show", "-n", "seedlike")
    api = yard.http.get("/workspaces/default/experiments/default/jobs/seedlike").text
    listed = yard.http.get("/workspaces/default/experiments/default/jobs").text
    for text in (run.stdout, run.stderr, shown.stdout, table.stdout, api, listed):
        assert az.key not in text
    assert "***" in shown.stdout
    leaks = []
    for path in yard.home.rglob("*"):
        if not path.is_file():  # node plans included: their copies hold no secret
            continue
        if az.key.encode() in path.read_bytes():
            leaks.append(str(path))
    assert not leaks, f"the account key is in clear in {leaks}"
    for plan in yard.home.rglob("*.plan.json"):
        assert plan.stat().st_mode & 0o077 == 0, f"{plan} is readable by others"


def test_failures_name_the_mount_and_cause(yard: Yard, cluster2: str, stores: Any,
                                           tmp_path: Path) -> None:
    az, _s3 = stores
    wrong = "AAAA" + az.key[4:]
    run = yard.cli("job", "create", "-f", str(_write(tmp_path, _batchai_job(az, wrong))),
                   "-n", "wrongkey", "-c", cluster2, "--wait", timeout=120)
    job = yard.job("wrongkey")
    assert job["state"] == "failed", str(run)
    assert "mount scripts" in job["message"] and "access denied" in job["message"]
    assert wrong not in run.stdout + run.stderr
    run = yard.cli("job", "create", "-f",
                   str(_write(tmp_path, _batchai_job(az, az.key, container="nosuch"))),
                   "-n", "nocontainer", "-c", cluster2, "--wait", timeout=120)
    job = yard.job("nocontainer")
    assert job["state"] == "failed" and "mount scripts" in job["message"]
    assert "not found" in job["message"], job["message"]
    events = {e["to"] for e in yard.job("nocontainer")["events"] if e.get("to")}
    assert "running" not in events, events


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    folder = tmp_path / f"bai-{len(list(tmp_path.glob('bai-*')))}"
    folder.mkdir()
    path = folder / "job.json"
    path.write_text(json.dumps(data))
    return path


def test_unreachable_storage_fails_in_preparing(yard: Yard, cluster2: str, stores: Any,
                                                tmp_path: Path) -> None:
    az, _s3 = stores
    yard.ok("datastore", "register", "gone", "--kind", "azure_blob", "--account-name", "gone",
            "--container", "datasets", "--endpoint", "http://127.0.0.1:9/gone",
            "--account-key", az.key, "--no-verify")
    job_file = yard.write_job("unreach", {
        "name": "unreach", "command": "echo never",
        "inputs": {"DATA": {"path": "datastore://gone/x", "mode": "download"}}})
    yard.cli("job", "create", "-f", str(job_file), "-c", cluster2, "--wait", timeout=120)
    job = yard.job("unreach")
    assert job["state"] == "failed"
    assert "input DATA" in job["message"] and "unreachable" in job["message"], job["message"]
    shutil.rmtree(tmp_path, ignore_errors=True)
