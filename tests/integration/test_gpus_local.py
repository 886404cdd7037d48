"""GPUs on one machine, with the tests' fake ``nvidia-smi`` (tests/data/nvidia-smi: two NVIDIA
H200s with UUIDs of this module's own) first on the server's PATH and a private GPU claims
directory: two virtual nodes of a 1-GPU size get disjoint GPUs and a third is refused (at
cluster create and at resize), the nodes record each GPU's name, memory and UUID and
``cluster node list``, ``cluster show`` and the portal show them (never the size table's
K80), every rank gets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, an agent started on the same machine
gets only a GPU no virtual node holds (and takes GPU UUIDs in its CUDA_VISIBLE_DEVICES), and
a one-node GPU job gets the GPU pre-flight."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from yardkit import Yard, pid_alive, wait_until

pytestmark = pytest.mark.timeout(300)

FAKE_SMI = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"


def fake_gpus(count: int, name: str = "NVIDIA H200", memory_mb: int = 143771
              ) -> list[dict[str, Any]]:
    return [{"name": name, "uuid": f"GPU-{uuid.uuid4()}", "memory_mb": memory_mb,
             "bus_id": f"00000000:{0x18 + 0x12 * i:02X}:00.0"} for i in range(count)]


def gpu_yard(tmp: Path, gpus: list[dict[str, Any]]) -> Yard:
    """A yard whose machine has ``gpus`` (fake nvidia-smi) and its own claims directory."""
    (tmp / "home").mkdir()
    (tmp / "work").mkdir()
    y = Yard(tmp / "home", tmp / "work")
    spec = tmp / "gpus.json"
    spec.write_text(json.dumps(gpus))
    y.env.update({"PATH": f"{FAKE_SMI}:{y.env['PATH']}", "FAKE_NVIDIA_SMI_GPUS": str(spec),
                  "BATCHYARD_GPU_CLAIMS": str(tmp / "claims")})
    return y


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Yard, list[dict[str, Any]]]]:
    gpus = fake_gpus(2)
    y = gpu_yard(tmp_path_factory.mktemp("gpus2"), gpus)
    try:
        y.start_server()
        yield y, gpus
    finally:
        y.stop()


def _nodes(y: Yard, cluster: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = y.js("cluster", "node", "list", "-c", cluster)
    return data


def test_two_virtual_nodes_get_disjoint_gpus_and_a_third_is_refused(two: Any) -> None:
    y, gpus = two
    y.ok("cluster", "create", "-n", "nc", "-s", "Standard_NC6", "-t", "2")
    y.wait_cluster("nc", 2)
    nodes = _nodes(y, "nc")
    ids = [n["resources"]["gpu_ids"] for n in nodes]
    assert sorted(ids) == [[0], [1]], ids  # disjoint: one GPU each, never the same one
    for node in nodes:
        (device,) = node["resources"]["gpu_devices"]
        assert device == {"id": device["index"], "index": device["index"],
                          "uuid": gpus[device["index"]]["uuid"], "name": "NVIDIA H200",
                          "memory_mb": 143771}, device
    listed = y.ok("cluster", "node", "list", "-c", "nc").stdout
    assert "NVIDIA H200, 140 GiB, " + "-".join(gpus[0]["uuid"].split("-")[:2]) in listed, listed
    shown = y.ok("cluster", "show", "-n", "nc").stdout
    assert "1 GPU (NVIDIA H200)" in shown and "K80" not in shown, shown
    more = y.cli("cluster", "create", "-n", "more", "-s", "Standard_NC6", "-t", "1")
    assert more.rc == 2, more
    assert "need 1 GPU(s), but this machine has 2 and 0 of them are free" in more.stderr, more
    assert "virtual node nc-0" in more.stderr and "Traceback" not in more.stderr, more
    assert [c["name"] for c in y.js("cluster", "list")] == ["nc"]  # nothing was stored
    grow = y.cli("cluster", "resize", "-n", "nc", "-t", "3")
    assert grow.rc == 2 and "0 of them are free" in grow.stderr, grow
    assert y.cluster("nc")["target_nodes"] == 2
    # a CPU size still fits next to them, and the portal names the GPUs too
    y.ok("cluster", "create", "-n", "cpu", "-s", "Standard_D2_v2", "-t", "1")
    with httpx.Client(base_url=y.url, timeout=60) as portal:
        signed = portal.post("/login", data={"token": y.token, "next": "/"},
                             headers={"Origin": y.url})
        assert signed.status_code == 303, signed.text
        page = portal.get("/clusters").text
        shown_html = page[:page.index('id="cluster-data"')]  # (the JSON has the size table)
        assert "1 GPU (NVIDIA H200)" in shown_html and "K80" not in shown_html
        assert page.count('class="gpu-device"') == 2, page
        api = portal.get("/portal/api/ws/default/clusters").json()
        gpu_cluster = next(c for c in api if c["name"] == "nc")
        assert gpu_cluster["gpu_models"] == ["NVIDIA H200"], gpu_cluster
        assert all(n["gpu_devices"] for n in gpu_cluster["nodes"]), gpu_cluster


def test_each_rank_sees_its_own_gpu_in_pci_order(two: Any) -> None:
    y, _ = two
    path = y.write_job("see", {"nodes": 2, "distribution": {"type": "pytorch"},
                               "command": "echo rank $RANK sees $CUDA_VISIBLE_DEVICES "
                                          "order $CUDA_DEVICE_ORDER gpus $AZ_BATCHAI_NUM_GPUS"})
    y.ok("job", "create", "-f", str(path), "-n", "see", "-c", "nc")
    job = y.wait_job("see", timeout=120)
    assert job["state"] == "succeeded", job
    logs = y.ok("job", "logs", "-n", "see").stdout
    nodes = {n["name"]: n["resources"]["gpu_ids"][0] for n in _nodes(y, "nc")}
    for rank, node in enumerate(n["node"] for n in job["attempts"][-1]["nodes"]):
        assert f"rank {rank} sees {nodes[node]} order PCI_BUS_ID gpus 1" in logs, logs


def _agent(y: Yard, cluster: str, work: Path, name: str,
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    line = y.js("cluster", "join-command", "-n", cluster)["command"]
    argv = shlex.split(line)[1:]
    agent_env = {k: v for k, v in y.env.items() if k not in ("BATCHYARD_HOME",)}
    agent_env.update(env or {})
    log = open(work.parent / f"{name}.log", "ab")  # noqa: SIM115 (closed by the process)
    return subprocess.Popen([sys.executable, "-m", "batchyard.cli.main", *argv,
                             "--work-dir", str(work), "--name", name], env=agent_env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_an_agent_on_the_same_machine_never_gets_a_held_gpu(two: Any) -> None:
    y, gpus = two
    y.ok("cluster", "create", "-n", "own", "--backend", "machines", "-s", "Standard_NC6")
    agents = []
    try:
        first = y.work / "agent-a"
        agents.append(_agent(y, "own", first, "agent-a"))
        wait_until(lambda: len(_nodes(y, "own")) == 1, 60, what="agent-a to join")
        (joined,) = _nodes(y, "own")
        assert joined["resources"]["gpus"] == 0, joined  # both are held by nc-0 and nc-1
        y.ok("cluster", "resize", "-n", "nc", "-t", "1")
        wait_until(lambda: len(_nodes(y, "nc")) == 1, 60, what="nc to shrink")
        kept = _nodes(y, "nc")[0]["resources"]["gpu_ids"][0]
        freed = gpus[1 - kept]["uuid"]
        # a second agent, given GPUs by UUID as a container runtime or Slurm would: only the
        # free one is its, under the UUID it was given
        given = ",".join(g["uuid"] for g in gpus)
        agents.append(_agent(y, "own", y.work / "agent-b", "agent-b",
                             {"CUDA_VISIBLE_DEVICES": given}))
        wait_until(lambda: len(_nodes(y, "own")) == 2, 60, what="agent-b to join")
        second = next(n for n in _nodes(y, "own") if n["name"] == "agent-b")
        assert second["resources"]["gpu_ids"] == [freed], second
        assert second["resources"]["gpu_devices"][0]["name"] == "NVIDIA H200", second
        path = y.write_job("byuuid", {"command": "echo visible $CUDA_VISIBLE_DEVICES"})
        y.ok("job", "create", "-f", str(path), "-n", "byuuid", "-c", "own")
        job = y.wait_job("byuuid", timeout=120)
        assert job["state"] == "succeeded", job
        assert f"visible {freed}" in y.ok("job", "logs", "-n", "byuuid").stdout
    finally:
        for proc in agents:
            proc.terminate()
        for proc in agents:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        assert not [p.pid for p in agents if pid_alive(p.pid)]


def test_a_one_node_gpu_job_gets_the_gpu_preflight(two: Any) -> None:
    y, gpus = two
    path = y.write_job("pf1", {"preflight": "gpu", "command": "echo ran"})
    y.ok("job", "create", "-f", str(path), "-n", "pf1", "-c", "nc")
    job = y.wait_job("pf1", timeout=120)
    assert job["state"] == "succeeded", job
    events = [e["message"] or "" for e in job["events"]]
    node = _nodes(y, "nc")[0]["name"]
    assert any(m.startswith("pre-flight passed on 1 node in ")
               and f"gpu: {node}: 1 GPU(s) healthy" in m for m in events), events
    # the same GPU going bad: the lone node is set aside before the job's code runs
    kept = _nodes(y, "nc")[0]["resources"]["gpu_ids"][0]
    spec = Path(y.env["FAKE_NVIDIA_SMI_GPUS"])
    spec.write_text(json.dumps([{**g, "bad": i == kept} for i, g in enumerate(gpus)]))
    try:
        path = y.write_job("pf2", {"preflight": "gpu", "command": "echo should not run"})
        y.ok("job", "create", "-f", str(path), "-n", "pf2", "-c", "nc")
        wait_until(lambda: _nodes(y, "nc")[0]["state"] == "unusable", 120,
                   what="the node with the bad GPU to be marked unusable")
        reason = _nodes(y, "nc")[0]["reason"]
        assert "unhealthy GPU: GPU " in reason and "uncorrectable ECC error" in reason, reason
        # placed again, on no node: it waits (its attempt ends just after the node is marked)
        job = wait_until(lambda: (j := y.job("pf2"))["state"] != "preparing" and j, 30, 0.05,
                         what="pf2's attempt to end")
        assert job["state"] == "queued", job
        assert "should not run" not in y.ok("job", "logs", "-n", "pf2").stdout
    finally:
        spec.write_text(json.dumps(gpus))
        y.cli("job", "terminate", "-n", "pf2")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    y = gpu_yard(tmp_path_factory.mktemp("gpus4"), fake_gpus(4))
    try:
        y.start_server()
        yield y
    finally:
        y.stop()


def test_diagnose_all_reduces_within_each_node_over_all_its_gpus(four: Yard) -> None:
    """One rank per GPU: within each node over its 2 GPUs, then over all 4 across the 2
    nodes (gloo here: no CUDA on this machine; on GPUs the default is nccl)."""
    four.ok("cluster", "create", "-n", "nc12", "-s", "Standard_NC12", "-t", "2")
    four.wait_cluster("nc12", 2)
    text = four.ok("cluster", "diagnose", "-n", "nc12", "--transport", "gloo", "--reps", "20",
                   timeout=300).stdout
    for node in ("nc12-0", "nc12-1"):
        assert f"allreduce of 4 MiB within node {node} over 2 GPU(s): " in text, text
    assert "allreduce of 4 MiB over 2 node(s) (4 ranks): " in text, text
    data = four.js("cluster", "diagnose", "-n", "nc12", "--transport", "gloo", "--reps", "20",
                   timeout=300)
    assert data["nodes"] == ["nc12-0", "nc12-1"], data
    assert [(r["node"], r["local_rank"]) for r in data["ranks"]] == [
        ("nc12-0", 0), ("nc12-0", 1), ("nc12-1", 0), ("nc12-1", 1)], data["ranks"]
    gpus = {n["name"]: n["resources"]["gpu_ids"] for n in _nodes(four, "nc12")}
    assert [r["gpu"] for r in data["ranks"]] == [str(g) for n in ("nc12-0", "nc12-1")
                                                 for g in gpus[n]]
    intra = {x["node"]: x for x in data["intra_node"]}
    assert sorted(intra) == ["nc12-0", "nc12-1"], data
    for node, found in intra.items():
        assert found["ranks"] == 2 and found["gpus"] == [str(g) for g in gpus[node]]
        assert found["busbw_MBps"] > 0, found
    assert data["allreduce"]["ranks"] == 4 and data["allreduce"]["busbw_MBps"] > 0
    (pair,) = data["pairs"]  # between the nodes, once
    assert {pair["a"], pair["b"]} == {"nc12-0", "nc12-1"}, data["pairs"]


def test_diagnose_on_one_cpu_node_measures_something(four: Yard) -> None:
    four.ok("cluster", "create", "-n", "solo", "-s", "Standard_D2_v2", "-t", "1")
    four.wait_cluster("solo", 1)
    data = four.js("cluster", "diagnose", "-n", "solo", "--transport", "gloo", "--reps", "20",
                   timeout=300)
    assert data["nodes"] == ["solo-0"] and data["allreduce"]["ranks"] == 2, data
    assert data["allreduce"]["busbw_MBps"] > 0, data
    (pair,) = data["pairs"]
    assert (pair["a"], pair["b"]) == ("solo-0/rank0", "solo-0/rank1"), pair
    assert pair["latency_us"] > 0 and pair["bandwidth_MBps"] > 0, pair
