"""The node launcher through the local backend: real launchers and rank processes. A launcher
gets its plan from the server and reports there (the node channel), so a real server runs
too; the second test calls the backend itself, as a server that died mid-launch would."""

from __future__ import annotations

import types
from typing import Any

import pytest

from batchyard.backends.base import Gang, NodeInfo
from batchyard.backends.local import LocalBackend
from batchyard.server.services.channel import launch_token
from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(180)


def _submit(yard: Yard, cluster: str, name: str, command: str | list[str]) -> None:
    path = yard.write_job(name, {"name": name, "nodes": 2, "command": command,
                                 "distribution": {"processes_per_node": 2}})
    yard.ok("job", "create", "-f", str(path), "-c", cluster)


def test_ranks_that_exit_at_once_are_all_seen(yard: Yard, cluster2: str) -> None:
    """Regression: a rank exiting before its siblings started was reaped by a collected
    Popen and never reported, leaving the node 'running' forever."""
    for i in range(5):
        _submit(yard, cluster2, f"instant{i}", ["true"])
    for i in range(5):
        job = yard.wait_job(f"instant{i}", timeout=60)
        assert job["state"] == "succeeded", job
        assert [n["state"] for n in yard.node_reports(job)] == ["succeeded", "succeeded"]
        assert all(r["exit_code"] == 0 for n in yard.node_reports(job) for r in n["ranks"])


def _gang_of(yard: Yard, job: dict[str, Any]) -> Gang:
    """The gang of the job's attempt as the server handed it to the backend: the same
    nodes, server address and (derived) launcher credentials."""
    attempt = job["attempts"][-1]
    names = [f"{job['cluster']}-{i}" for i in range(2)]
    nodes = [NodeInfo(name, i, "127.0.0.1", str(yard.node_dir(job, name)), {})
             for i, name in enumerate(names)]
    ctx: Any = types.SimpleNamespace(admin_token=yard.token)
    return Gang(job_id=job["id"], job_name=job["name"], workspace=job["workspace"],
                experiment=job["experiment"], attempt=attempt["number"],
                attempt_uuid=attempt["uuid"], attempt_dir=str(yard.attempt_dir(job)),
                checkpoint_dir="", spec={}, nodes=nodes, server_url=yard.url,
                launch_tokens=[launch_token(ctx, attempt["uuid"], r) for r in range(2)])


def test_launch_is_idempotent(yard: Yard, cluster2: str,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that died mid-launch launches again: the second launch of the same gang
    (here at about the moment of the server's own) starts no rank twice."""
    monkeypatch.setenv("BATCHYARD_HOME", str(yard.home))  # the backend's node dirs
    _submit(yard, cluster2, "twice", 'echo "ran $RANK"; sleep 2')
    job = wait_until(lambda: (j := yard.job("twice"))["attempts"] and j, 30, 0.02,
                     "the attempt to be launched")
    backend = LocalBackend()
    second = backend.launch(_gang_of(yard, job))
    assert len(second["launchers"]) == 2
    job = yard.wait_job("twice", timeout=60)
    assert job["state"] == "succeeded", job
    assert job["attempt"] == 1
    logs = yard.ok("job", "logs", "-n", "twice").stdout
    for rank in range(4):
        assert logs.count(f"ran {rank}\n") == 1, logs
    wait_until(lambda: not any(backend.alive(second)), 15, what="the launchers to exit")
