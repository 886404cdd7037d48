"""Health checks of GPUs (issue 36 §4) on the local backend, with the tests' fake nvidia-smi
(tests/data/nvidia-smi): a node whose GPU reports an uncorrectable ECC error is made
`unusable` by its periodic check and comes back by itself once the GPU is healthy again; a
node that fails a job's pre-flight twice in a day is held, and only `cluster node enable`
brings it back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(300)

FAKE_SMI = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
HELD = ("its second failed pre-flight within a day: kept out until "
        "`batchyard cluster node enable`")


@pytest.fixture(scope="module")
def gpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Yard, list[dict[str, Any]]]]:
    """A yard whose machine has 2 fake GPUs (read at each nvidia-smi call)."""
    tmp = tmp_path_factory.mktemp("hgpu")
    (tmp / "home").mkdir()
    (tmp / "work").mkdir()
    y = Yard(tmp / "home", tmp / "work")
    found = [{"name": "NVIDIA H200", "uuid": f"GPU-{uuid.uuid4()}", "memory_mb": 143771,
              "bus_id": f"00000000:{0x18 + 0x12 * i:02X}:00.0"} for i in range(2)]
    spec = tmp / "gpus.json"
    spec.write_text(json.dumps(found))
    y.env.update({"PATH": f"{FAKE_SMI}:{y.env['PATH']}", "FAKE_NVIDIA_SMI_GPUS": str(spec),
                  "BATCHYARD_GPU_CLAIMS": str(tmp / "claims")})
    try:
        y.start_server()
        yield y, found
    finally:
        y.stop()


def _node(y: Yard, cluster: str) -> dict[str, Any]:
    nodes = y.js("cluster", "node", "list", "-c", cluster)
    assert len(nodes) == 1, nodes
    return dict(nodes[0])


def _break(y: Yard, found: list[dict[str, Any]], gpu: int | None) -> None:
    Path(y.env["FAKE_NVIDIA_SMI_GPUS"]).write_text(
        json.dumps([{**g, "bad": i == gpu} for i, g in enumerate(found)]))


def test_a_gpu_with_ecc_errors_is_set_aside_by_its_check_and_returns_when_healthy(
        gpus: tuple[Yard, list[dict[str, Any]]]) -> None:
    y, found = gpus
    y.ok("cluster", "create", "hg", "-s", "Standard_NC6", "-t", "1",
         "--health-check-every", "1s")
    y.wait_cluster("hg", 1)
    node = _node(y, "hg")
    mine = int(node["resources"]["gpu_ids"][0])
    started = time.time()

    def checked() -> dict[str, Any] | None:
        last = (_node(y, "hg").get("health") or {}).get("last") or {}
        return last if last.get("ok") and last.get("at", 0) > started else None

    last = wait_until(checked, 30, 0.2, "a passing check of the node's GPU")
    gpu = next(c for c in last["checks"] if c["name"] == "gpu")
    assert gpu["message"].startswith("1 GPU(s) healthy"), gpu
    _break(y, found, mine)
    try:
        def unusable() -> dict[str, Any] | None:
            n = _node(y, "hg")
            return n if n["state"] == "unusable" else None

        node = wait_until(unusable, 30, 0.2, "the node with the bad GPU to be unusable")
        assert node["reason"].startswith(f"health check: GPU {mine} (NVIDIA H200, "), node
        assert "uncorrectable ECC error" in node["reason"], node
    finally:
        _break(y, found, None)
    node = wait_until(lambda: (n := _node(y, "hg"))["state"] == "idle" and n, 30, 0.2,
                      "the node to come back with a healthy GPU")
    assert node["reason"] is None and node["health"]["last"]["ok"], node
    y.ok("cluster", "delete", "hg", "--yes")


def test_a_second_failed_preflight_in_a_day_holds_the_node_until_enabled(
        gpus: tuple[Yard, list[dict[str, Any]]]) -> None:
    y, found = gpus
    y.ok("cluster", "create", "hp", "-s", "Standard_NC6", "-t", "1")
    wait_until(lambda: y.cluster("hp")["node_counts"]["idle"] == 1, 60, 0.2, "hp idle")
    name = _node(y, "hp")["name"]
    _break(y, found, int(_node(y, "hp")["resources"]["gpu_ids"][0]))
    try:
        path = y.write_job("pfh", {"preflight": "gpu", "command": "echo should not run"})
        y.ok("job", "create", "-f", str(path), "-n", "pfh", "-c", "hp")
        wait_until(lambda: _node(y, "hp")["state"] == "unusable", 120, 0.2,
                   "the first failed pre-flight")
        node = _node(y, "hp")
        assert node["reason"].startswith("pre-flight of job pfh: unhealthy GPU"), node
        assert HELD not in node["reason"] and not node["health"]["held"], node
        assert len(node["health"]["preflight_failures"]) == 1, node
        # enabled by hand, the queued job comes back to it and fails its pre-flight again
        y.ok("cluster", "node", "enable", "-c", "hp", "-n", name)
        seen: list[dict[str, Any]] = []

        def held() -> bool:
            seen[:] = [_node(y, "hp")]
            return seen[0]["state"] == "unusable" and seen[0]["reason"].endswith(f"({HELD})")

        try:
            wait_until(held, 120, 0.2, "the second failed pre-flight")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen} {y.job('pfh')}") from None
        node = _node(y, "hp")
        assert node["health"]["held"] and len(node["health"]["preflight_failures"]) == 2, node
        listed = y.ok("cluster", "node", "list", "-c", "hp").stdout
        assert "held until enabled" in listed, listed
        assert "should not run" not in y.ok("job", "logs", "-n", "pfh").stdout
        y.ok("job", "terminate", "-n", "pfh")
    finally:
        _break(y, found, None)
    back = y.js("cluster", "node", "enable", "-c", "hp", "-n", name)
    assert back["state"] == "idle", back
    health = back.get("health") or {}
    assert not health.get("held") and not health.get("preflight_failures"), back
