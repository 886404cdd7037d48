"""The node launcher on its own (no server): real processes through the local backend."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from batchyard.backends.base import Gang
from batchyard.backends.local import LocalBackend


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalBackend:
    monkeypatch.setenv("BATCHYARD_HOME", str(tmp_path / "home"))
    return LocalBackend()


def _gang(backend: LocalBackend, tmp_path: Path, name: str, command: str | list[str],
          ppn: int = 2) -> Gang:
    nodes = [backend.provision_node("c", "w", i, {"vcpus": 2}) for i in range(2)]
    return Gang(job_id=1, job_name=name, workspace="w", experiment="e", attempt=1,
                attempt_uuid=f"uuid-{name}", attempt_dir=str(tmp_path / name),
                checkpoint_dir=str(tmp_path / "ckpt"),
                spec={"command": command, "distribution": {"processes_per_node": ppn}},
                nodes=nodes)


def _wait_done(backend: LocalBackend, handle: dict[str, object], timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = backend.poll(handle)  # type: ignore[arg-type]
        if status.done:
            return [n.state for n in status.nodes]
        time.sleep(0.05)
    raise AssertionError(f"gang not done after {timeout}s: {backend.poll(handle).nodes}")  # type: ignore[arg-type]


def test_ranks_that_exit_at_once_are_all_seen(backend: LocalBackend, tmp_path: Path) -> None:
    """Regression: a rank exiting before its siblings started was reaped by a collected
    Popen and never reported, leaving the node 'running' forever."""
    for i in range(5):
        handle = backend.launch(_gang(backend, tmp_path, f"instant{i}", ["true"]))
        assert _wait_done(backend, handle) == ["succeeded", "succeeded"]


def test_launch_is_idempotent(backend: LocalBackend, tmp_path: Path) -> None:
    gang = _gang(backend, tmp_path, "twice", "echo $RANK >> $BATCHYARD_CHECKPOINT_DIR/ran")
    first = backend.launch(gang)
    second = backend.launch(gang)  # a server that died mid-launch launches again
    assert _wait_done(backend, first) == ["succeeded", "succeeded"]
    _wait_done(backend, second)
    assert sorted((tmp_path / "ckpt" / "ran").read_text().split()) == ["0", "1", "2", "3"]
