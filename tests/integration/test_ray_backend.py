"""The Ray backend on a real Ray cluster on this machine (raykit): a head and two raylets
carrying ``batchyard/big``, token authentication on. Same jobs and env contract as the local
backend; a gang larger than the cluster pends with a reason until a third raylet joins; a
raylet killed under a running job fails it within 10 s, naming the node, no rank left."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raykit import RayCluster
from yardkit import Yard, tagged_pids, wait_until

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
DUMP_ENV = """\
import json, os
env = dict(os.environ)
target = os.path.join(env["BATCHYARD_OUTPUT_MODEL"], "env-rank%s.json" % env["RANK"])
with open(target + ".tmp", "w") as fh:
    json.dump(env, fh)
os.replace(target + ".tmp", target)
print("dumped rank", env["RANK"])
"""


@pytest.fixture(scope="module")
def raycluster() -> Iterator[RayCluster]:
    rc = RayCluster("batchyard/big")
    try:
        rc.start_head()
        rc.add_raylet("a")
        rc.add_raylet("b")
        yield rc
    finally:
        rc.stop()


@pytest.fixture(scope="module")
def big(yard: Yard, raycluster: RayCluster) -> str:
    # 4 slots per node (as the examples' local cluster), for mnist-mpi's 4 ranks per node
    yard.ok("cluster", "create", "-n", "big", "--backend", "ray", "--address",
            raycluster.address, "--ray-token-file", str(raycluster.token_file), "--cpus", "4")
    yard.wait_cluster("big", 2, timeout=60)
    return "big"


def _nodes(yard: Yard) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = yard.js("cluster", "node", "list", "-c", "big")
    return data


def test_ray_nodes_are_discovered(yard: Yard, big: str, raycluster: RayCluster) -> None:
    nodes = _nodes(yard)
    assert [n["index"] for n in nodes] == [0, 1]
    for node in nodes:
        assert node["state"] == "idle" and node["address"]
        assert node["resources"]["ray_resource"] == "batchyard/big"
        assert node["resources"]["cpus"] == 2 and node["resources"]["ray_node_id"]
    shown = yard.ok("cluster", "show", "-n", big, "--output", "json").stdout
    assert raycluster.token not in shown
    logs = "".join(p.read_text(errors="replace") for p in yard.home.rglob("*.log"))
    assert raycluster.token not in logs


def test_env_contract_on_ray(yard: Yard, big: str, raycluster: RayCluster,
                             tmp_path: Path) -> None:
    job_file = yard.write_job("rayenv", {
        "name": "rayenv", "nodes": 2, "distribution": {"type": "pytorch",
                                                       "processes_per_node": 2},
        "code": ".", "command": "python dump_env.py", "outputs": {"MODEL": {}},
    }, files={"dump_env.py": DUMP_ENV})
    run = yard.cli("job", "create", "-f", str(job_file), "-c", big, "--wait", timeout=300)
    assert run.rc == 0, str(run)
    yard.ok("job", "file", "download", "-n", "rayenv", "--path", "outputs/MODEL",
            "--dest", str(tmp_path))
    names = [n["name"] for n in _nodes(yard)]
    ranks = {r: json.loads((tmp_path / "outputs" / "MODEL" / f"env-rank{r}.json").read_text())
             for r in range(4)}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in ranks.values()}) == 1
    for rank, env in ranks.items():
        node_rank, local = divmod(rank, 2)
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (str(rank), "4",
                                                                        str(local))
        assert env["NODE_RANK"] == env["BATCHYARD_NODE_RANK"] == str(node_rank)
        assert env["BATCHYARD_NODE_NAME"] == names[node_rank]
        assert env["AZ_BATCHAI_TASK_INDEX"] == str(node_rank)
        assert not [k for k in env if k.startswith("RAY_")], "Ray's variables reached a rank"
        assert raycluster.token not in json.dumps(env)


def test_mnist_ddp_on_ray(yard: Yard, big: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    code = yard.work / "mnist-ddp"
    shutil.copytree(REPO / "examples" / "mnist-ddp", code,
                    ignore=shutil.ignore_patterns("outputs"))
    run = yard.cli("job", "create", "-f", str(code / "job.yaml"), "-c", big, "--wait",
                   timeout=600)
    assert run.rc == 0, str(run)
    job = yard.job("mnist-ddp")
    assert job["state"] == "succeeded", job


def test_mnist_mpi_on_ray(yard: Yard, big: str) -> None:
    pytest.importorskip("mpi4py")
    pytest.importorskip("sklearn")
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI")
    code = yard.work / "mnist-mpi"
    shutil.copytree(REPO / "examples" / "mnist-mpi", code,
                    ignore=shutil.ignore_patterns("outputs"))
    run = yard.cli("job", "create", "-f", str(code / "job.yaml"), "-c", big, "--wait",
                   timeout=600)
    assert run.rc == 0, str(run)
    assert yard.job("mnist-mpi")["state"] == "succeeded"


def test_gang_larger_than_cluster_pends_then_runs(yard: Yard, big: str,
                                                  raycluster: RayCluster) -> None:
    job_file = yard.write_job("three", {
        "name": "three", "nodes": 3, "distribution": {"type": "pytorch",
                                                      "processes_per_node": 1},
        "command": ["python", "-c", "import os; print('rank', os.environ['RANK'])"],
    })
    yard.ok("job", "create", "-f", str(job_file), "-c", big)
    job = wait_until(lambda: (j := yard.job("three"))["pending_reason"] not in (
        None, "waiting for the scheduler") and j, 30, 0.2, "a pending reason")
    assert job["state"] == "queued" and "3" in job["pending_reason"], job
    raycluster.add_raylet("c")
    done = yard.wait_job("three", timeout=180)
    assert done["state"] == "succeeded", done
    assert len(_nodes(yard)) == 3


def test_terminate_kills_ranks_and_frees_the_placement_group(yard: Yard, big: str) -> None:
    job_file = yard.write_job("stopme", {
        "name": "stopme", "nodes": 3, "distribution": {"type": "pytorch",
                                                       "processes_per_node": 1},
        "command": ["python", "-c", "import time; time.sleep(600)"],
    })
    yard.ok("job", "create", "-f", str(job_file), "-c", big)
    job = yard.wait_job("stopme", ("running",), timeout=120)
    yard.ok("job", "terminate", "-n", "stopme")
    assert yard.wait_job("stopme", timeout=60)["state"] == "canceled"
    uuid = job["attempts"][-1]["uuid"]
    wait_until(lambda: not tagged_pids(uuid), 10, 0.1, "no rank process left")
    # the same 3 nodes take a new 3-bundle gang at once: actors and placement group are gone
    again = yard.write_job("again", {
        "name": "again", "nodes": 3, "distribution": {"type": "pytorch",
                                                      "processes_per_node": 1},
        "command": ["python", "-c", "print('ok')"],
    })
    run = yard.cli("job", "create", "-f", str(again), "-c", big, "--wait", timeout=180)
    assert run.rc == 0, str(run)


def test_raylet_killed_under_running_job(yard: Yard, big: str,
                                         raycluster: RayCluster) -> None:
    job_file = yard.write_job("doomed", {
        "name": "doomed", "nodes": 2, "distribution": {"type": "pytorch",
                                                       "processes_per_node": 2},
        "command": ["python", "-c", "import time; time.sleep(600)"],
    })
    yard.ok("job", "create", "-f", str(job_file), "-c", big)
    job = yard.wait_job("doomed", ("running",), timeout=120)
    attempt = yard.attempt_dir(job)
    status = wait_until(lambda: json.loads((attempt / ".batchyard" / "node-1.status.json")
                                           .read_text()).get("ranks") and json.loads(
        (attempt / ".batchyard" / "node-1.status.json").read_text()), 30, 0.1, "ranks")
    rank_pid = int(status["ranks"][0]["pid"])
    label = raycluster.label_of(rank_pid)
    assert label is not None, "rank 1 does not run under a raylet of this cluster"
    node_name = status["node"]
    raycluster.kill_node(label)
    killed_at = time.monotonic()
    ended = yard.wait_job("doomed", ("failed", "queued"), timeout=10)
    took = time.monotonic() - killed_at
    text = json.dumps(ended)
    assert node_name in text, ended
    uuid = job["attempts"][-1]["uuid"]
    wait_until(lambda: not tagged_pids(uuid), 10, 0.1, "no rank process left")
    print(f"raylet kill -> job {ended['state']} in {took:.1f} s: {ended.get('message')}")

    def left() -> bool:
        nodes = yard.http.get("/workspaces/default/clusters/big/nodes").json()
        return node_name not in [n["name"] for n in nodes]

    wait_until(left, 20, 0.2, f"{node_name} to leave the cluster's node list")
