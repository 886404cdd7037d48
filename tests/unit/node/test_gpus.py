"""GPU discovery and the machine's GPU claims, offline: nvidia-smi's CSV and ``-L`` outputs
(in the formats of driver 550, as the tests' fake prints them), CUDA_VISIBLE_DEVICES by
index, by GPU UUID (or a unique prefix of one) and by MIG UUID, and claims that never give
one GPU to two holders and free a GPU when its holder is gone."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from batchyard.node import gpuclaims
from batchyard.node.gpus import discover_gpus, label, parse_list, parse_query

FAKE = Path(__file__).resolve().parents[2] / "data" / "nvidia-smi"
QUERY = """\
0, GPU-8a3c6f1e-4b2d-4c7e-9f10-1d2e3f4a5b6c, NVIDIA H200, 143771, 00000000:18:00.0
1, GPU-2f9e8d7c-6b5a-4938-8271-605f4e3d2c1b, NVIDIA H200, 143771, 00000000:2A:00.0
"""
LISTING = """\
GPU 0: NVIDIA H200 (UUID: GPU-8a3c6f1e-4b2d-4c7e-9f10-1d2e3f4a5b6c)
  MIG 1g.18gb     Device  0: (UUID: MIG-5c2f4e3d-2b1a-5f0e-9d8c-7b6a5f4e3d2c)
  MIG 1g.18gb     Device  1: (UUID: MIG-6d3e5f4a-3c2b-5a1f-8e9d-8c7b6a5f4e3d)
GPU 1: NVIDIA H200 (UUID: GPU-2f9e8d7c-6b5a-4938-8271-605f4e3d2c1b)
"""


def test_parse_nvidia_smi_outputs() -> None:
    gpus = parse_query(QUERY)
    assert gpus[1] == {"id": 1, "index": 1, "uuid": "GPU-2f9e8d7c-6b5a-4938-8271-605f4e3d2c1b",
                       "name": "NVIDIA H200", "memory_mb": 143771, "bus_id": "00000000:2A:00.0"}
    assert parse_query("No devices were found\n") == []
    migs = parse_list(LISTING)
    assert [(m["id"], m["index"], m["name"]) for m in migs] == [
        ("MIG-5c2f4e3d-2b1a-5f0e-9d8c-7b6a5f4e3d2c", 0, "NVIDIA H200 MIG 1g.18gb"),
        ("MIG-6d3e5f4a-3c2b-5a1f-8e9d-8c7b6a5f4e3d", 0, "NVIDIA H200 MIG 1g.18gb")]
    assert label(gpus[0]) == "0: NVIDIA H200, 140 GiB, GPU-8a3c6f1e"


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The fake nvidia-smi on PATH with two H200s, one with two MIG devices."""
    gpus = [{"name": "NVIDIA H200", "uuid": "GPU-8a3c6f1e-4b2d-4c7e-9f10-1d2e3f4a5b6c",
             "memory_mb": 143771, "bus_id": "00000000:18:00.0",
             "migs": [{"profile": "1g.18gb", "uuid": "MIG-5c2f4e3d-2b1a-5f0e-9d8c-7b6a5f4e3d2c"}]},
            {"name": "NVIDIA H200", "uuid": "GPU-2f9e8d7c-6b5a-4938-8271-605f4e3d2c1b",
             "memory_mb": 143771, "bus_id": "00000000:2A:00.0"}]
    spec = tmp_path / "gpus.json"
    spec.write_text(json.dumps(gpus))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", str(spec))
    monkeypatch.setenv("PATH", f"{FAKE}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("BATCHYARD_GPU_CLAIMS", str(tmp_path / "claims"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return gpus


def test_discovery_through_nvidia_smi_and_cuda_visible_devices(
        machine: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    found = discover_gpus()
    assert [(g["id"], g["uuid"], g["name"], g["memory_mb"]) for g in found] == [
        (i, g["uuid"], "NVIDIA H200", 143771) for i, g in enumerate(machine)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g["uuid"] for g in discover_gpus()] == [machine[1]["uuid"]]
    # UUIDs as a container runtime, Slurm or a device plugin give them: kept as given
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES",
                       "GPU-2f9e8d7c,MIG-5c2f4e3d-2b1a-5f0e-9d8c-7b6a5f4e3d2c")
    got = discover_gpus()
    assert [(g["id"], g["index"], g["name"]) for g in got] == [
        ("GPU-2f9e8d7c", 1, "NVIDIA H200"),
        ("MIG-5c2f4e3d-2b1a-5f0e-9d8c-7b6a5f4e3d2c", 0, "NVIDIA H200 MIG 1g.18gb")]
    assert got[0]["uuid"] == machine[1]["uuid"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")  # CUDA: no device
    assert discover_gpus() == []
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: only what the variable names
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,GPU-abc")
    assert [(g["id"], g["name"]) for g in discover_gpus()] == [(0, None), ("GPU-abc", None)]


def test_claims_never_share_a_gpu_and_free_it_with_its_holder(
        machine: list[dict[str, Any]], tmp_path: Path) -> None:
    gpus = discover_gpus()
    node_a, node_b = tmp_path / "nodes" / "a", tmp_path / "nodes" / "b"
    node_a.mkdir(parents=True)
    node_b.mkdir(parents=True)
    a = gpuclaims.local_owner(str(node_a), "c-0")
    b = gpuclaims.local_owner(str(node_b), "c-1")
    got_a = gpuclaims.claim(gpus, 1, a)
    got_b = gpuclaims.claim(gpus, 1, b)
    assert [g["index"] for g in got_a] == [0] and [g["index"] for g in got_b] == [1]
    assert gpuclaims.claim(gpus, 1, a) == got_a  # again: the one it holds, not another
    work = tmp_path / "agent"
    work.mkdir()
    agent = gpuclaims.agent_owner(str(work))
    with pytest.raises(gpuclaims.NotEnoughGpus, match=r"needs 1 GPU\(s\) but 0 of this "
                       r"machine's 2 are free \(held by virtual node c-0"):
        gpuclaims.claim(gpus, 1, agent)
    assert gpuclaims.claim(gpus, None, agent) == []  # every free one: none
    assert set(gpuclaims.taken(gpus, a)) == {machine[1]["uuid"]}
    shutil.rmtree(node_b)  # its node is gone (a deleted home): the GPU is free again
    assert [g["index"] for g in gpuclaims.claim(gpus, None, agent)] == [1]
    assert gpuclaims.release(a["key"]) == 1
    assert [g["index"] for g in gpuclaims.claim(gpus, None, agent)] == [0, 1]
    with pytest.raises(gpuclaims.NotEnoughGpus):
        gpuclaims.claim(gpus, 1, a)
