"""The environment contract of every rank (DESIGN §4), checked value by value on a real
2 nodes x 2 processes job: every rank dumps its environment as JSON into an output dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)

DUMP_ENV = """\
import json, os
env = dict(os.environ)
paths = ("AZ_BATCHAI_MOUNT_ROOT", "AZ_BATCHAI_JOB_MOUNT_ROOT", "AZ_BATCHAI_OUTPUT_MODEL",
         "BATCHYARD_OUTPUT_MODEL", "AZ_BATCHAI_STDOUTERR_DIR", "AZ_BATCHAI_JOB_TEMP",
         "AZ_BATCHAI_SHARED_JOB_TEMP", "BATCHYARD_CHECKPOINT_DIR")
env["__isdir__"] = {name: os.path.isdir(env.get(name, "")) for name in paths}
env["__cwd__"] = os.getcwd()
target = os.path.join(env["BATCHYARD_OUTPUT_MODEL"], "env-rank%s.json" % env["RANK"])
with open(target + ".tmp", "w") as fh:
    json.dump(env, fh)
os.replace(target + ".tmp", target)
print("dumped rank", env["RANK"])
"""

NODES = ["local2-0", "local2-0", "local2-1", "local2-1"]  # node of each global rank


@pytest.fixture(scope="module")
def envs(yard, cluster2, tmp_path_factory) -> dict[str, Any]:
    """Run the dump job once; every test of this module reads its result."""
    job_file = yard.write_job("envdump", {
        "name": "envdump", "experiment": "contract", "nodes": 2,
        "distribution": {"type": "pytorch", "processes_per_node": 2},
        "code": ".", "command": "python dump_env.py",
        "outputs": {"MODEL": {}},
        "env": {"MY_SETTING": "plain"}, "secrets": {"MY_SECRET": "hush-123"},
    }, files={"dump_env.py": DUMP_ENV})
    run = yard.cli("job", "create", "-f", str(job_file), "-c", cluster2, "--wait")
    assert run.rc == 0, str(run)
    job = yard.js("job", "show", "-n", "envdump", "-e", "contract")
    dest = tmp_path_factory.mktemp("envdump")
    yard.ok("job", "file", "download", "-n", "envdump", "-e", "contract",
            "--path", "outputs/MODEL", "--dest", str(dest))
    ranks = {}
    for rank in range(4):
        path = dest / "outputs" / "MODEL" / f"env-rank{rank}.json"
        assert path.is_file(), f"rank {rank} wrote no env dump"
        ranks[rank] = json.loads(path.read_text())
    # the server's copies (logs, uploaded outputs), and each node's own attempt dir
    return {"job": job, "ranks": ranks, "attempt_dir": yard.attempt_dir(job),
            "node_dirs": yard.node_attempt_dirs(job)}


def test_torchrun_variables(envs):
    ranks = envs["ranks"]
    masters = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in ranks.values()}
    assert len(masters) == 1, masters
    addr, port = masters.pop()
    assert addr == "127.0.0.1" and 0 < int(port) < 65536
    run_ids = {e["TORCHELASTIC_RUN_ID"] for e in ranks.values()}
    assert run_ids == {envs["job"]["attempts"][-1]["uuid"]}
    for rank, env in ranks.items():
        node_rank, local_rank = divmod(rank, 2)  # ordered by node rank, then local rank
        assert env["RANK"] == str(rank)
        assert env["LOCAL_RANK"] == str(local_rank)
        assert env["WORLD_SIZE"] == "4"
        assert env["LOCAL_WORLD_SIZE"] == "2"
        assert env["NODE_RANK"] == str(node_rank)
        assert env["GROUP_RANK"] == str(node_rank)
        assert env["ROLE_RANK"] == str(rank)
        assert env["ROLE_WORLD_SIZE"] == "4"


def test_ranks_run_on_their_nodes(envs):
    for rank, env in envs["ranks"].items():
        assert env["BATCHYARD_NODE_NAME"] == NODES[rank]
    # each rank's log file carries its node name and global rank
    stdouterr = envs["attempt_dir"] / "stdouterr"
    for rank, node in enumerate(NODES):
        text = (stdouterr / f"{node}-rank{rank}.stdout.txt").read_text()
        assert f"dumped rank {rank}" in text


def test_batchyard_variables(envs, yard):
    job = envs["job"]
    ranks = envs["ranks"]
    for rank, env in ranks.items():
        assert env["BATCHYARD_JOB_ID"] == str(job["id"])
        assert env["BATCHYARD_ATTEMPT"] == "1"
        assert env["BATCHYARD_NODE_RANK"] == str(rank // 2)
        assert env["BATCHYARD_NUM_NODES"] == "2"
        assert env["BATCHYARD_NODE_IPS"].split("\n") == ["127.0.0.1", "127.0.0.1"]
        assert env["BATCHYARD_PROCESSES_PER_NODE"] == "2"
        assert env["BATCHYARD_API"] == yard.url
        assert env["MY_SETTING"] == "plain" and env["MY_SECRET"] == "hush-123"
    # one dir per node for the whole job (next to its attempt dirs, kept across attempts on
    # that node): nodes share no disk
    for rank, env in ranks.items():
        node_dir = envs["node_dirs"][rank // 2]
        assert Path(env["BATCHYARD_CHECKPOINT_DIR"]) == node_dir.parent / "checkpoints"
        assert env["__isdir__"]["BATCHYARD_CHECKPOINT_DIR"], rank
    assert ranks[0]["BATCHYARD_CHECKPOINT_DIR"] == ranks[1]["BATCHYARD_CHECKPOINT_DIR"]
    assert ranks[0]["BATCHYARD_CHECKPOINT_DIR"] != ranks[2]["BATCHYARD_CHECKPOINT_DIR"]


def test_job_token_is_scoped_not_admin(envs, yard):
    tokens = {e["BATCHYARD_TOKEN"] for e in envs["ranks"].values()}
    assert len(tokens) == 1
    token = tokens.pop()
    assert token and token != yard.token
    assert yard.token not in json.dumps(envs["ranks"])  # the admin token reaches no rank
    # a job token does not open admin routes
    for path in ("/api/v1/workspaces", "/api/v1/workspaces/default/clusters",
                 "/api/v1/workspaces/default/experiments/contract/jobs/envdump"):
        resp = httpx.get(yard.url + path, headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 401, (path, resp.status_code, resp.text)


def test_batch_ai_variables(envs):
    ranks = envs["ranks"]
    for rank, env in ranks.items():
        node_rank = rank // 2
        attempt_dir = envs["node_dirs"][node_rank]  # the node's own; the server has copies
        assert env["AZ_BATCHAI_TASK_INDEX"] == str(node_rank)
        assert env["AZ_BATCHAI_NUM_GPUS"] == "0"
        assert env["AZ_BATCHAI_STDOUTERR_DIR"] == str(attempt_dir / "stdouterr")
        assert env["AZ_BATCHAI_SHARED_JOB_TEMP"] == str(attempt_dir / "shared")
        # no shared file system: torch rendezvous over TCP at node 0
        assert env["AZ_BATCHAI_PYTORCH_INIT_METHOD"] == (
            f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}")
        for name in ("AZ_BATCHAI_MOUNT_ROOT", "AZ_BATCHAI_JOB_MOUNT_ROOT",
                     "AZ_BATCHAI_STDOUTERR_DIR", "AZ_BATCHAI_JOB_TEMP",
                     "AZ_BATCHAI_SHARED_JOB_TEMP"):
            assert env["__isdir__"][name], f"rank {rank}: {name}={env[name]} is not a dir"
    # same on a node, different between nodes (each virtual node has its own directory)
    for name in ("AZ_BATCHAI_MOUNT_ROOT", "AZ_BATCHAI_JOB_MOUNT_ROOT", "AZ_BATCHAI_JOB_TEMP",
                 "AZ_BATCHAI_SHARED_JOB_TEMP", "AZ_BATCHAI_STDOUTERR_DIR"):
        assert ranks[0][name] == ranks[1][name] and ranks[2][name] == ranks[3][name], name
        assert ranks[0][name] != ranks[2][name], name
    # shared by the whole gang
    for name in ("AZ_BATCHAI_PYTORCH_INIT_METHOD", "AZ_BATCH_MASTER_NODE"):
        assert len({e[name] for e in ranks.values()}) == 1, name


def test_azure_ml_variables(envs):
    job = envs["job"]
    for env in envs["ranks"].values():
        assert env["AZ_BATCH_MASTER_NODE"] == f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        assert env["AZUREML_EXPERIMENT_NAME"] == "contract"
        assert env["AZUREML_RUN_ID"]
        assert job["name"] in env["AZUREML_RUN_ID"]
    assert len({e["AZUREML_RUN_ID"] for e in envs["ranks"].values()}) == 1


def test_outputs_dir(envs):
    for rank, env in envs["ranks"].items():
        assert env["BATCHYARD_OUTPUT_MODEL"] == env["AZ_BATCHAI_OUTPUT_MODEL"]
        assert env["__isdir__"]["BATCHYARD_OUTPUT_MODEL"], rank
        node_dir = envs["node_dirs"][rank // 2]  # written on the node, uploaded at the end
        assert Path(env["BATCHYARD_OUTPUT_MODEL"]) == node_dir / "outputs" / "MODEL"
    # the server's copy holds what every node's ranks wrote
    copy = envs["attempt_dir"] / "outputs" / "MODEL"
    assert sorted(p.name for p in copy.iterdir()) == [f"env-rank{r}.json" for r in range(4)]
