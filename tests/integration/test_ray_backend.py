"""The Ray backend on a real Ray cluster on this machine (raykit): a head and two raylets
carrying ``batchyard/big``, token authentication on. Same jobs and env contract as the local
backend; a gang larger than the cluster pends with a reason until a third raylet joins (its node
keeps its work dir on its own disk: launchers reach the server only over the node channel); a
raylet killed under a running job fails it within 10 s, naming the node, no rank left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import strictkit
from raykit import RayCluster
from yardkit import Yard, pid_alive, tagged_pids, wait_until

strictkit.importorskip("ray")
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
    strictkit.importorskip("torch")
    strictkit.importorskip("sklearn")
    code = yard.work / "mnist-ddp"
    shutil.copytree(REPO / "examples" / "mnist-ddp", code,
                    ignore=shutil.ignore_patterns("outputs"))
    run = yard.cli("job", "create", "-f", str(code / "job.yaml"), "-c", big, "--wait",
                   timeout=600)
    assert run.rc == 0, str(run)
    job = yard.job("mnist-ddp")
    assert job["state"] == "succeeded", job


def test_mnist_mpi_on_ray(yard: Yard, big: str) -> None:
    strictkit.importorskip("mpi4py")
    strictkit.importorskip("sklearn")
    if shutil.which("mpirun") is None:
        strictkit.missing("needs Open MPI")
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
    # the third raylet's host picks a work dir of its own (nothing is shared with the server)
    own_root = raycluster.tmp / "c-root"
    raycluster.add_raylet("c", env={"BATCHYARD_NODE_ROOT": str(own_root)})
    done = yard.wait_job("three", timeout=180)
    assert done["state"] == "succeeded", done
    nodes = _nodes(yard)
    assert len(nodes) == 3
    third = [n for n in nodes if n["directory"].startswith(str(own_root))]
    assert len(third) == 1, [n["directory"] for n in nodes]
    uuid = done["attempts"][-1]["uuid"]
    assert list(own_root.rglob(f"tickets/{uuid}.*.json")), "no ticket on the node's own disk"
    assert list(own_root.rglob(f"{uuid}/stdouterr/*")), "the node's logs are not its own"
    logs = (yard.attempt_dir(done) / "stdouterr").iterdir()  # the server's copies, by channel
    assert any(p.name.startswith(third[0]["name"]) for p in logs)


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


def test_loopback_server_is_out_of_reach_of_other_hosts() -> None:
    """A server on 127.0.0.1 cannot be reached from a raylet on another host: the launch says
    so at once (start the server with --host) instead of leaving launchers knocking."""
    from batchyard.backends.base import Gang, NodeInfo
    from batchyard.backends.ray import RayBackend

    def gang(address: str, server: str) -> Gang:
        return Gang(job_id=1, job_name="j", workspace="default", experiment="default",
                    attempt=1, attempt_uuid="u", attempt_dir="", checkpoint_dir="", spec={},
                    nodes=[NodeInfo("big-x", 0, address, "/nonexistent", {})],
                    server_url=server, launch_tokens=["t"])

    with pytest.raises(RuntimeError, match="--host"):
        RayBackend._check_reachable(gang("203.0.113.7", "http://127.0.0.1:8080"))
    RayBackend._check_reachable(gang("127.0.0.1", "http://127.0.0.1:8080"))
    RayBackend._check_reachable(gang("203.0.113.7", "https://198.51.100.1:8080"))


def test_server_killed_and_restarted_under_a_ray_job(yard: Yard, big: str) -> None:
    """The launchers and their actors outlive the server; a restarted one (a new Ray driver,
    no actor handles) follows them from the attempt's handle: the job stays running (no false
    "lost" from a slow reconnect), and a launcher that dies afterwards is seen as dead."""
    job_file = yard.write_job("survivor", {
        "name": "survivor", "nodes": 2, "distribution": {"type": "pytorch",
                                                         "processes_per_node": 1},
        "command": ["python", "-c", "import time; time.sleep(600)"],
    })
    yard.ok("job", "create", "-f", str(job_file), "-c", big)
    job = yard.wait_job("survivor", ("running",), timeout=120)
    pids = wait_until(lambda: len(p := yard.recorded_pids(yard.job("survivor"))) >= 4 and p,
                      30, 0.1, "the launchers and ranks to report")
    old_pid, old_url = yard.server_pid, yard.url
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(old_pid), 10, what="the server to die")
    assert all(pid_alive(p) for p in pids), "launchers or ranks died with the server"
    yard.start_server(port=int(old_url.rsplit(":", 1)[1]))
    time.sleep(8)  # longer than the backend's LOST_AFTER: a silent actor would be lost by now
    assert yard.job("survivor")["state"] == "running"
    report = next(r for r in yard.node_reports(yard.job("survivor")) if r["node_rank"] == 1)
    os.kill(int(report["pid"]), signal.SIGKILL)  # node 1's launcher
    ended = yard.wait_job("survivor", timeout=15)
    assert ended["state"] == "failed" and "launcher" in (ended.get("message") or ""), ended
    uuid = job["attempts"][-1]["uuid"]
    wait_until(lambda: not tagged_pids(uuid), 10, 0.1, "no rank process left")


def test_raylet_killed_under_running_job(yard: Yard, big: str,
                                         raycluster: RayCluster) -> None:
    job_file = yard.write_job("doomed", {
        "name": "doomed", "nodes": 2, "distribution": {"type": "pytorch",
                                                       "processes_per_node": 2},
        "command": ["python", "-c", "import time; time.sleep(600)"],
    })
    yard.ok("job", "create", "-f", str(job_file), "-c", big)
    job = yard.wait_job("doomed", ("running",), timeout=120)

    def node1() -> dict[str, Any] | None:  # as its launcher reported it over the node channel
        reports = yard.node_reports(yard.job("doomed"))
        found = next((r for r in reports if r.get("node_rank") == 1), None)
        return found if found and found.get("ranks") else None

    status = wait_until(node1, 30, 0.1, "node 1's ranks")
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
