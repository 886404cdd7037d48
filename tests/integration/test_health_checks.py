"""Periodic node health checks (issue 36 §4) on the local backend: a virtual node whose work
dir (a small tmpfs of its own, mounted as root) is made full by a bounded file becomes
`unusable` with the measured reason, a job waits instead of landing on it, and once the
space is freed the node passes its checks 3 times in a row, is idle again by itself and runs
the job. Bad `--health-check-every` values are refused naming the flag (exit 2) or the field
(422). The same on agent hosts: tests/e2e/test_health_checks_multihost.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import strictkit
from yardkit import Yard, wait_until

pytestmark = strictkit.requires(os.geteuid() != 0, "mounting a tmpfs needs root")

CLUSTER = "hc"


def _node(yard: Yard) -> dict[str, Any]:
    nodes = yard.js("cluster", "node", "list", "-c", CLUSTER)
    assert len(nodes) == 1, nodes
    return dict(nodes[0])


@pytest.fixture
def small_node_dir(yard: Yard) -> Iterator[Path]:
    created = yard.js("cluster", "create", CLUSTER, "-t", "1", "--health-check-every", "1s")
    assert created["health_check_every"] == 1.0 and created["health_check_passes"] == 3
    yard.wait_cluster(CLUSTER, 1)
    folder = Path(_node(yard)["directory"])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "hc-work",
                    str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_work_dir_makes_the_node_unusable_until_space_is_freed(
        yard: Yard, small_node_dir: Path) -> None:
    shown = yard.ok("cluster", "show", CLUSTER).stdout
    assert "Health checks" in shown and "every 1.0s; back after 3 passes in a row" in shown

    def checked() -> dict[str, Any] | None:
        node = _node(yard)
        last = (node.get("health") or {}).get("last") or {}
        return node if last.get("ok") and last.get("at", 0) > started else None

    started = time.time()
    node = wait_until(checked, 30, 0.2, "a passing health check on the small work dir")
    disk = next(c for c in node["health"]["last"]["checks"] if c["name"] == "disk")
    assert disk["total_bytes"] == 16 << 20, disk

    filler = small_node_dir / "filler"
    free = shutil.disk_usage(small_node_dir).free
    with open(filler, "wb") as fh:  # bounded: leaves 256 KiB, under 5 % of 16 MiB
        fh.write(b"\0" * (free - (256 << 10)))

    def unusable() -> dict[str, Any] | None:
        found = _node(yard)
        return found if found["state"] == "unusable" else None

    node = wait_until(unusable, 30, 0.2, "the node with a full work dir to be unusable")
    reason = node["reason"]
    assert reason.startswith(f"health check: work dir {small_node_dir} has "), reason
    assert "free of 16.0 MiB (under 819.2 KiB)" in reason, reason
    listed = yard.ok("cluster", "node", "list", "-c", CLUSTER).stdout
    assert "unusable" in listed and "health check: work dir" in listed, listed

    yard.ok("job", "create", "-n", "hcjob", "-c", CLUSTER, "--", "echo", "ran")
    time.sleep(3)
    assert yard.job("hcjob")["state"] == "queued", yard.job("hcjob")
    assert _node(yard)["state"] == "unusable"

    freed_at = time.time()
    filler.unlink()
    def back() -> dict[str, Any] | None:
        found = _node(yard)
        return found if found["state"] in ("idle", "running") else None

    back_node = wait_until(back, 30, 0.2, "the node to come back once space is freed")
    assert back_node["reason"] is None, back_node
    took = time.time() - freed_at
    assert took >= 2.0, took  # three passes, a second apart, not the first one
    job = yard.wait_job("hcjob", timeout=60)
    assert job["state"] == "succeeded", job
    assert job["attempts"][-1]["nodes"][0]["node"] == back_node["name"], job


@pytest.mark.parametrize("value", ["-1", "abc", "0"])
def test_bad_health_check_every_is_refused_naming_the_flag(yard: Yard, value: str) -> None:
    result = yard.cli("cluster", "create", "hcbad", "--health-check-every", value)
    assert result.rc == 2, str(result)
    assert "--health-check-every" in result.stderr and "Traceback" not in result.stderr, \
        str(result)
    assert "hcbad" not in yard.ok("cluster", "list").stdout


@pytest.mark.parametrize("value", ["abc", -1, 0])
def test_bad_health_check_every_over_the_api_is_a_422_naming_the_field(
        yard: Yard, value: object) -> None:
    resp = yard.http.post("/workspaces/default/clusters", json={
        "name": "hcapi", "health_check_every": value, "manual": {"target_node_count": 0}})
    assert resp.status_code == 422, resp.text
    assert "health_check_every" in resp.text, resp.text


def test_health_checks_are_refused_on_a_backend_batchyard_does_not_check(yard: Yard) -> None:
    result = yard.cli("cluster", "create", "hcray", "--backend", "ray",
                      "--health-check-every", "1m")
    assert result.rc == 2, str(result)
    assert "health_check_every" in result.stderr, str(result)
