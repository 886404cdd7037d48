"""The container lines a node runs (pure parts of node/container.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from batchyard.node import container


def test_binds_fold_nested_paths_and_keep_read_only_apart() -> None:
    got = container.binds(["/w/jobs/j1", "/w/jobs/j1/mounts/logs", "/w/ws/a1"],
                          read_only=["/opt/by/node", "/w/ws/a1"])
    assert got == [("/opt/by/node", "ro"), ("/w/jobs/j1", "rw"), ("/w/ws/a1", "rw")]


def test_run_line_has_host_network_shm_labels_and_same_path_mounts() -> None:
    argv = container.run_argv("docker", ["docker"], image="local/x:1", name="by-abc-0",
                              attempt_uuid="abc", node_rank=0, job_name="j",
                              mounts=[("/w/a", "rw"), ("/ca.pem", "ro")], shm=None, gpus=None,
                              user="0:0")
    line = " ".join(argv)
    assert argv[:4] == ["docker", "run", "-d", "--rm"]
    assert "--network host" in line and "--init" in line
    assert f"--shm-size {container.DEFAULT_SHM}" in line
    assert "-v /w/a:/w/a:rw" in line and "-v /ca.pem:/ca.pem:ro" in line
    assert "--label batchyard.attempt=abc" in line and "--user 0:0" in line
    assert argv[-3:] == ["sleep", "local/x:1", "infinity"]
    assert "--gpus" not in line


def test_gpus_per_runtime() -> None:
    common = dict(image="i", name="n", attempt_uuid="u", node_rank=1, job_name="j", mounts=[],
                  shm="8G")
    docker = container.run_argv("docker", ["docker"], gpus=[0, 2], **common)  # type: ignore[arg-type]
    podman = container.run_argv("podman", ["podman"], gpus=[0, 2], **common)  # type: ignore[arg-type]
    assert "--gpus" in docker and '"device=0,2"' in docker
    assert "NVIDIA_VISIBLE_DEVICES=0,2" in docker and "--shm-size" in docker
    assert docker[docker.index("--shm-size") + 1] == "8g"
    assert podman.count("--device") == 2 and "nvidia.com/gpu=2" in podman


def test_exec_passes_variables_by_name_only() -> None:
    argv = container.exec_argv(["podman"], "box", ["SECRET", "RANK"], "/w/wd",
                               ["bash", "-c", "echo $SECRET"])
    assert argv == ["podman", "exec", "-w", "/w/wd", "-e", "RANK", "-e", "SECRET", "box",
                    "bash", "-c", "echo $SECRET"]


def test_registry_host_and_auth_file() -> None:
    assert container.registry_of("127.0.0.1:5000/private/x:1") == "127.0.0.1:5000"
    assert container.registry_of("myreg.azurecr.io/x") == "myreg.azurecr.io"
    assert container.registry_of("localhost/local/x") == "localhost"
    assert container.registry_of("batchaitraining/chainermn:IntelMPI") is None
    assert container.auth_config("x", None) is None
    auth = container.auth_config("127.0.0.1:5000/p/x", {"username": "u", "password": "p w"})
    assert auth is not None
    token = auth["auths"]["127.0.0.1:5000"]["auth"]
    assert base64.b64decode(token).decode() == "u:p w"
    hub = container.auth_config("user/x", {"username": "u", "password": "p",
                                           "server": "reg.example:443"})
    assert hub is not None and list(hub["auths"]) == ["reg.example:443"]


def test_pull_lines(tmp_path: Path) -> None:
    auth = tmp_path / "config.json"
    docker = container.Runtime("docker", ("docker",), "20.10")
    podman = container.Runtime("podman", ("podman",), "4.3")
    argv, env = container.pull_argv(docker, "127.0.0.1:5000/x", auth)
    assert argv == ["docker", "pull", "-q", "127.0.0.1:5000/x"]
    assert env == {"DOCKER_CONFIG": str(tmp_path)}
    argv, env = container.pull_argv(podman, "127.0.0.1:5000/x", auth)
    assert "--authfile" in argv and "--tls-verify=false" in argv and env == {}
    argv, _ = container.pull_argv(podman, "myreg.azurecr.io/x", None)
    assert "--tls-verify=false" not in argv and "--authfile" not in argv


def test_container_names_are_per_attempt_and_node() -> None:
    a = container.container_name("0123456789abcdef0123", 0)
    b = container.container_name("0123456789abcdef0123", 1)
    assert a != b and a.startswith("by-") and len(a) < 64
    json.dumps(a)


def test_a_refused_run_is_a_start_failure_not_a_pull_failure(tmp_path: Path) -> None:
    """The runtime's own words, as a StartError (the launcher classes it a preparation
    failure): the image is there, its container would not start."""
    import os

    import pytest

    tool = tmp_path / "podman"
    tool.write_text("#!/bin/sh\necho 'Error: invalid container path \"rel/x\", must be an "
                    "absolute path' >&2\nexit 125\n")
    tool.chmod(0o755)
    runtime = container.Runtime("podman", (str(tool),), "4.3.1")
    with pytest.raises(container.StartError, match=r"starting the container failed: Error: "
                       r"invalid container path \"rel/x\", must be an absolute path"):
        container.start(runtime, [str(tool), "run", "-d", "img"], dict(os.environ))
    assert not issubclass(container.StartError, container.PullError)
