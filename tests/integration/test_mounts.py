"""Mounts are real: ``ro_mount`` inputs, ``rw_mount`` outputs and Batch AI
``azureBlobFileSystems`` are FUSE mounts (rclone) of real Azurite containers and a real moto
S3 bucket, seen as ``fuse.rclone`` in the job's own ``/proc/mounts``; what a rw mount got is in
the bucket after the job, whether it succeeded, failed or was terminated; no rclone and no
mount is left, not even after a SIGKILLed launcher; where FUSE cannot be used the copy is said
in ``job logs``; an NFS ``fileServers`` mount is never skipped silently."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import strictkit
from storagekit import AzuriteServer, MotoServer, azurite, azurite_available, moto_s3
from yardkit import Yard, tagged_pids, wait_until

pytestmark = [
    strictkit.requires(not azurite_available(), "azurite is not installed "
                       "(scripts/setup.sh installs it with npm)"),
    strictkit.requires(not (shutil.which("rclone") and shutil.which("fusermount3")
                            and os.path.exists("/dev/fuse")),
                       "rclone, fuse3 or /dev/fuse missing (scripts/setup.sh)"),
]

# What the job sees: its mount table, and every rclone's command line (none: the job's PID
# namespace shows no process of the launcher's; and no secret may be in one)
PROBE = '''
import json, os, pathlib, sys
mounts = [line.split()[:3] for line in open("/proc/mounts")]
rclones = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
    except OSError:
        continue
    if argv and argv[0].endswith(b"rclone"):
        rclones.append(b" ".join(argv).decode())
print(json.dumps({"mounts": mounts, "rclones": rclones}))
'''


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AzuriteServer,
                                                                      MotoServer]]:
    with azurite(tmp_path_factory.mktemp("azurite")) as az, moto_s3() as s3:
        fs: Any = az.fs()
        for container in ("datasets", "scripts", "result"):
            fs.mkdir(container)
        for i in range(3):
            fs.pipe_file(f"datasets/mnist/part-{i}.bin", bytes([i]) * (1000 + i))
        fs.pipe_file("scripts/run.sh", b"echo from-the-mounted-script\n")
        s3fs: Any = s3.fs()
        s3fs.mkdir("models")
        yield az, s3


@pytest.fixture(scope="module")
def stores(yard: Yard, servers: tuple[AzuriteServer, MotoServer]
           ) -> tuple[AzuriteServer, MotoServer]:
    az, s3 = servers
    yard.ok("datastore", "register", "blobdata", "--kind", "azure_blob", "--account-name",
            az.account, "--container", "datasets", "--endpoint", az.endpoint,
            "--account-key", az.key)
    yard.ok("datastore", "register", "models", "--kind", "s3", "--bucket", "models",
            "--endpoint", s3.endpoint, "--access-key-id", s3.key_id,
            "--secret-access-key", s3.secret)
    return az, s3


def _probe(text: str) -> dict[str, Any]:
    line = next(x for x in text.splitlines() if '"mounts"' in x)
    data: dict[str, Any] = json.loads(line[line.index("{"):])
    return data


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _fuse_at(probe: dict[str, Any], suffix: str) -> bool:
    return any(kind == "fuse.rclone" and where.endswith(suffix)
               for _dev, where, kind in probe["mounts"])


def _assert_nothing_left(job: dict[str, Any]) -> None:
    """No rclone (nor any process) of the attempt, and no mount of it in this namespace."""
    uuid = job["attempts"][-1]["uuid"]
    wait_until(lambda: not tagged_pids(uuid), 30, what="the attempt's processes to end")
    left = [line for line in Path("/proc/self/mounts").read_text().splitlines()
            if uuid in line or uuid[:8] in line.split()[1]]
    assert not left, left


def _native(yard: Yard, name: str, command: str, **extra: Any) -> Path:
    return yard.write_job(name, {"name": name, "code": ".", "command": command, **extra},
                          files={"probe.py": PROBE})


def test_ro_mount_input_and_rw_mount_output_are_fuse_mounts(yard: Yard, cluster2: str,
                                                            stores: Any) -> None:
    az, s3 = stores
    command = ("python probe.py && ls $AZ_BATCHAI_INPUT_DATA && "
               "cat $AZ_BATCHAI_INPUT_DATA/part-2.bin | wc -c && "
               "mkdir -p $BATCHYARD_OUTPUT_MODEL/ckpt && "
               "head -c 3000000 /dev/urandom > $BATCHYARD_OUTPUT_MODEL/ckpt/weights.bin && "
               "sha256sum $BATCHYARD_OUTPUT_MODEL/ckpt/weights.bin && "
               'until [ -e "$GO" ]; do sleep 0.1; done')
    go = yard.work / "fusejob.go"
    job_file = _native(yard, "fusejob", command, env={"GO": str(go)}, inputs={
        "DATA": {"path": "azureml://datastores/blobdata/paths/mnist", "mode": "ro_mount"}},
        outputs={"MODEL": {"datastore": "models", "mode": "rw_mount"}})
    yard.ok("job", "create", "-f", str(job_file), "-c", cluster2)
    uuid = wait_until(lambda: (yard.job("fusejob").get("attempts") or [{}])[-1].get("uuid"),
                      60, what="the job's attempt")
    rclones = wait_until(lambda: [argv for argv in map(_cmdline, tagged_pids(uuid))
                                  if argv.split(" ")[0].endswith("rclone")], 90,
                         what="the job's rclone mounts (seen from the host)")
    go.touch()
    job = yard.wait_job("fusejob", timeout=180)
    logs = yard.ok("job", "logs", "-n", "fusejob").stdout
    assert job["state"] == "succeeded", (job.get("message"), logs)
    probe = _probe(logs)
    assert _fuse_at(probe, "/inputs/DATA"), probe["mounts"]
    assert _fuse_at(probe, "/outputs/MODEL"), probe["mounts"]
    assert "1002" in logs and "part-0.bin" in logs, logs
    assert "input DATA: FUSE mount (rclone, read-only)" in logs, logs
    assert "output MODEL: FUSE mount (rclone, read-write)" in logs, logs
    assert probe["rclones"] == [], "the job's PID namespace shows it no rclone"
    for argv in rclones:
        assert az.key not in argv and s3.secret not in argv and "sig=" not in argv, argv
    digest = re.search(r"\b([0-9a-f]{64})\s+\S*weights\.bin", logs)
    assert digest, logs
    s3fs: Any = s3.fs()
    data = s3fs.cat_file("models/default/fusejob/model/ckpt/weights.bin")
    assert len(data) == 3000000 and hashlib.sha256(data).hexdigest() == digest[1]
    _assert_nothing_left(job)
    for path in yard.home.rglob("*"):  # rclone's own log included: no secret in clear
        if path.is_file():  # node plans included: their copies hold no secret
            blob = path.read_bytes()
            assert az.key.encode() not in blob and s3.secret.encode() not in blob, path


def test_batchai_blob_file_systems_are_mounted(yard: Yard, cluster2: str, stores: Any,
                                               tmp_path: Path) -> None:
    az, _s3 = stores
    spec = {"properties": {
        "nodeCount": 1,
        "customToolkitSettings": {"commandLine":
                                  "bash $AZ_BATCHAI_JOB_MOUNT_ROOT/scripts/run.sh && "
                                  "grep fuse.rclone /proc/mounts && "
                                  "echo trained > $AZ_BATCHAI_OUTPUT_MODEL/model.txt"},
        "mountVolumes": {"azureBlobFileSystems": [
            {"accountName": az.account, "containerName": "scripts",
             "credentials": {"accountKey": az.key}, "relativeMountPath": "scripts"},
            {"accountName": az.account, "containerName": "result",
             "credentials": {"accountKey": az.key}, "relativeMountPath": "result"}]},
        "outputDirectories": [{"id": "MODEL", "pathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/result"}],
    }}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    run = yard.cli("job", "create", "-f", str(path), "-n", "baimount", "-c", cluster2,
                   "--wait", timeout=180)
    job = yard.job("baimount")
    assert job["state"] == "succeeded", (str(run), job.get("message"))
    logs = yard.ok("job", "logs", "-n", "baimount").stdout
    assert "from-the-mounted-script" in logs
    assert "/mounts/scripts fuse.rclone" in logs and "/mounts/result fuse.rclone" in logs, logs
    fs: Any = az.fs()
    found = [p for p in fs.find("result") if p.endswith("outputs/MODEL/model.txt")]
    assert len(found) == 1 and fs.cat_file(found[0]) == b"trained\n", fs.find("result")
    _assert_nothing_left(job)


def test_failed_and_terminated_jobs_keep_what_they_wrote(yard: Yard, cluster2: str,
                                                         stores: Any) -> None:
    _az, s3 = stores
    s3fs: Any = s3.fs()
    outputs = {"MODEL": {"datastore": "models", "mode": "rw_mount"}}
    failing = _native(yard, "fusefail", "echo partial > $BATCHYARD_OUTPUT_MODEL/p.txt; exit 3",
                      outputs=outputs)
    yard.cli("job", "create", "-f", str(failing), "-c", cluster2, "--wait", timeout=180)
    job = yard.job("fusefail")
    assert job["state"] == "failed" and job["exit_code"] == 3, job
    assert s3fs.cat_file("models/default/fusefail/model/p.txt") == b"partial\n"
    _assert_nothing_left(job)

    held = _native(yard, "fuseterm", "echo step1 > $BATCHYARD_OUTPUT_MODEL/s.txt; "
                   "echo written; exec sleep 300", outputs=outputs,
                   limits={"grace_period": 2})
    yard.ok("job", "create", "-f", str(held), "-c", cluster2)
    wait_until(lambda: "written" in yard.cli("job", "logs", "-n", "fuseterm").stdout, 120,
               0.5, "the job to write its file")
    yard.ok("job", "terminate", "-n", "fuseterm", timeout=120)
    job = yard.wait_job("fuseterm", timeout=120)
    assert job["state"] == "canceled", job
    assert s3fs.cat_file("models/default/fuseterm/model/s.txt") == b"step1\n"
    _assert_nothing_left(job)


def test_sigkilled_launcher_leaves_no_mount(yard: Yard, cluster2: str, stores: Any) -> None:
    job_file = _native(yard, "fusekill", "echo mounted; exec sleep 300", inputs={
        "DATA": {"path": "azureml://datastores/blobdata/paths/mnist", "mode": "ro_mount"}},
        limits={"grace_period": 2})
    yard.ok("job", "create", "-f", str(job_file), "-c", cluster2)

    def launcher() -> int | None:
        job = yard.job("fusekill")
        reports = yard.node_reports(job) if job["state"] == "running" else []
        return int(reports[0]["pid"]) if reports and reports[0].get("ranks") else None

    pid = wait_until(launcher, 120, 0.2, "the job to run")
    uuid = yard.job("fusekill")["attempts"][-1]["uuid"]
    assert f"batchyard:{uuid}/0:" in Path("/proc/self/mounts").read_text()
    os.kill(pid, signal.SIGKILL)
    job = yard.wait_job("fusekill", timeout=120)
    assert job["state"] == "failed", job
    wait_until(lambda: f"batchyard:{uuid}/" not in Path("/proc/self/mounts").read_text(), 60,
               0.2, "the sweep to unmount what the dead launcher left")
    _assert_nothing_left(job)


def test_fallback_without_fuse_is_said_in_job_logs(servers: tuple[AzuriteServer, MotoServer],
                                                   tmp_path_factory: pytest.TempPathFactory
                                                   ) -> None:
    az, _s3 = servers
    other = Yard(tmp_path_factory.mktemp("nofuse-home"), tmp_path_factory.mktemp("nofuse"))
    other.env["BATCHYARD_NO_FUSE"] = "1"
    try:
        other.start_server()
        other.ok("datastore", "register", "blobdata", "--kind", "azure_blob",
                 "--account-name", az.account, "--container", "datasets", "--endpoint",
                 az.endpoint, "--account-key", az.key)
        other.ok("cluster", "create", "-n", "one", "-s", "Standard_D2_v2", "-t", "1")
        other.wait_cluster("one", 1, timeout=60)
        job_file = _native(other, "copied", "python probe.py && ls $AZ_BATCHAI_INPUT_DATA",
                           inputs={"DATA": {"path": "az://datasets/mnist", "mode": "ro_mount"}})
        run = other.cli("job", "create", "-f", str(job_file), "-c", "one", "--wait",
                        timeout=180)
        assert run.rc == 0, str(run)
        logs = other.ok("job", "logs", "-n", "copied").stdout
        assert ("input DATA: ro_mount: no FUSE mount (BATCHYARD_NO_FUSE is set on this "
                "node); falling back to download") in logs, logs
        assert "part-1.bin" in logs
        assert not _fuse_at(_probe(logs), "/inputs/DATA")
    finally:
        other.stop()


def test_nfs_file_server_is_never_skipped(yard: Yard, cluster2: str, tmp_path: Path) -> None:
    """Nothing serves NFS on 127.0.0.1 here, and this machine's kernel has no NFS client: the
    job fails in preparing, naming the mount and the cause, and never runs."""
    spec = {"properties": {
        "nodeCount": 1,
        "customToolkitSettings": {"commandLine": "echo should-not-run"},
        "mountVolumes": {"fileServers": [{"fileServer": {"id": "127.0.0.1:/export"},
                                          "relativeMountPath": "nfs"}]}}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    yard.cli("job", "create", "-f", str(path), "-n", "nfsjob", "-c", cluster2, "--wait",
             timeout=120)
    job = yard.job("nfsjob")
    assert job["state"] == "failed", job
    message = job["message"] or ""
    assert "mount nfs (fileServer 127.0.0.1:/export)" in message, message
    assert any(why in message for why in ("no NFS client", "unreachable", "nfs-common",
                                          "as root")), message
    assert "running" not in {e.get("to") for e in job["events"]}
    logs = yard.cli("job", "logs", "-n", "nfsjob").stdout
    assert "fileServer 127.0.0.1:/export" in logs and "should-not-run" not in logs, logs
    spec["properties"]["mountVolumes"]["fileServers"][0]["fileServer"]["id"] = "nfshost"
    path.write_text(json.dumps(spec))
    refused = yard.cli("job", "create", "-f", str(path), "-n", "nfsbad", "-c", cluster2)
    assert refused.rc == 2 and "host:/export" in refused.stderr, str(refused)
    assert "fileServers" in refused.stderr, str(refused)


def test_orphaned_mounts_are_swept_by_the_next_launcher(tmp_path: Path) -> None:
    """A mount whose rclone was SIGKILLed with no sweeper after it (as under Slurm) is stale;
    the next launcher that mounts lazily unmounts it, and spares live ones."""
    import subprocess
    import time

    from batchyard.node import fuse

    source = tmp_path / "src"
    source.mkdir()
    (source / "f.txt").write_text("x")
    procs = {}
    for name in ("dead", "live"):
        target = tmp_path / name
        target.mkdir()
        env = dict(os.environ, BATCHYARD_PROC_TAG=f"orphan-{name}-{os.getpid()}/0")
        procs[name] = subprocess.Popen(
            ["rclone", "mount", str(source), str(target), "--read-only", "--config",
             "/dev/null", "--devname", f"batchyard:{env['BATCHYARD_PROC_TAG']}:0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda t=target: fuse.is_mounted(t), 30, what=f"the {name} mount")
    try:
        procs["dead"].kill()
        procs["dead"].wait(10)
        time.sleep(0.2)
        assert fuse.is_mounted(tmp_path / "dead")  # stale: "transport endpoint not connected"
        assert fuse.sweep_orphans() >= 1
        assert not fuse.is_mounted(tmp_path / "dead")
        assert fuse.is_mounted(tmp_path / "live")
        assert (tmp_path / "live" / "f.txt").read_text() == "x"
    finally:
        for name, proc in procs.items():
            subprocess.run(["fusermount3", "-uz", str(tmp_path / name)], check=False,
                           capture_output=True)
            proc.kill()
            proc.wait(10)
