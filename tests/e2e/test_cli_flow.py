"""The whole `az batchai`-style CLI flow against a real server, as a user types it:
workspace / cluster / node / experiment / job / job file commands, short flags, default
workspace and experiment, `--output json` for every list/show, `job wait` and
`job create --wait` exit codes, `--dry-run` with secrets masked, `schema job`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(180)

SECRET = "s3cr3t-Value-7f1e9a"

# Every rank says who it is on stdout and stderr; rank 0 writes an output file.
FLOW_COMMAND = (
    'echo "hello rank $RANK of $WORLD_SIZE on $BATCHYARD_NODE_NAME"; '
    'echo "complaint from rank $RANK" >&2; '
    'if [ "$RANK" = 0 ]; then echo "the model" > "$BATCHYARD_OUTPUT_MODEL/model.txt"; fi'
)


def job_spec(command: str, nodes: int = 2, ppn: int = 2, **extra: Any) -> dict[str, Any]:
    return {"nodes": nodes, "distribution": {"type": "pytorch", "processes_per_node": ppn},
            "command": command, **extra}


def names(rows: list[dict[str, Any]]) -> list[str]:
    return [r["name"] for r in rows]


def test_workspace_crud(yard):
    created = yard.js("workspace", "create", "-n", "team-a", "--location", "eastus")
    assert created["name"] == "team-a"
    assert "team-a" in names(yard.js("workspace", "list"))
    shown = yard.js("workspace", "show", "-n", "team-a")
    assert shown["name"] == "team-a" and shown["location"] == "eastus"
    # table output names it too
    assert "team-a" in yard.ok("workspace", "list").stdout
    # duplicate: a user error, exit 2, one line, no traceback
    dup = yard.cli("workspace", "create", "-n", "team-a")
    assert dup.rc == 2, str(dup)
    assert "already exists" in dup.stderr and "Traceback" not in dup.stderr
    yard.ok("workspace", "delete", "-n", "team-a")
    assert "team-a" not in names(yard.js("workspace", "list"))
    missing = yard.cli("workspace", "show", "-n", "team-a")
    assert missing.rc == 3 and "Traceback" not in missing.stderr, str(missing)


def test_cluster_crud_resize_and_nodes(yard):
    yard.ok("workspace", "create", "-n", "team-b")
    created = yard.js("cluster", "create", "-n", "c1", "-w", "team-b", "-s", "Standard_D2_v2",
                      "-t", "1")
    assert created["name"] == "c1" and created["current_nodes"] == 1
    assert created["vm_size"] == "Standard_D2_v2"
    assert names(yard.js("cluster", "list", "-w", "team-b")) == ["c1"]
    assert "c1" in yard.ok("cluster", "list", "-w", "team-b").stdout
    # not visible from another workspace
    assert "c1" not in names(yard.js("cluster", "list"))

    grown = yard.js("cluster", "resize", "-n", "c1", "-w", "team-b", "-t", "2")
    assert grown["target_nodes"] == 2
    yard.wait_cluster("c1", 2, "team-b")  # nodes join asynchronously
    shown = yard.js("cluster", "show", "-n", "c1", "-w", "team-b")
    assert shown["node_counts"]["idle"] == 2 and shown["current_nodes"] == 2

    nodes = yard.js("cluster", "node", "list", "-c", "c1", "-w", "team-b")
    assert [n["name"] for n in nodes] == ["c1-0", "c1-1"]
    assert all(n["state"] == "idle" and n["address"] for n in nodes)

    ran = yard.ok("cluster", "node", "exec", "-c", "c1", "-w", "team-b", "-n", "c1-1",
                  "--exec", 'echo "on $BATCHYARD_NODE_NAME"; echo oops >&2')
    assert "on c1-1" in ran.stdout and "oops" in ran.stderr
    as_json = yard.js("cluster", "node", "exec", "-c", "c1", "-w", "team-b", "-n", "c1-0",
                      "--exec", "echo hi")
    assert as_json["exit_code"] == 0 and as_json["stdout"] == "hi\n"
    # `-- CMD ARGS` form; node exec exits with the command's exit code
    failed = yard.cli("cluster", "node", "exec", "-c", "c1", "-w", "team-b", "-n", "c1-0",
                      "--", "sh", "-c", "exit 5")
    assert failed.rc == 5, str(failed)

    shrunk = yard.js("cluster", "resize", "-n", "c1", "-w", "team-b", "-t", "1")
    assert shrunk["target_nodes"] == 1
    yard.wait_cluster("c1", 1, "team-b")
    assert len(yard.js("cluster", "node", "list", "-c", "c1", "-w", "team-b")) == 1

    busy = yard.cli("workspace", "delete", "-n", "team-b")
    assert busy.rc == 2 and "clusters" in busy.stderr, str(busy)
    yard.ok("cluster", "delete", "-n", "c1", "-w", "team-b")
    assert yard.js("cluster", "list", "-w", "team-b") == []
    yard.ok("workspace", "delete", "-n", "team-b")


def test_experiment_crud(yard):
    created = yard.js("experiment", "create", "-n", "exp-crud")
    assert created["name"] == "exp-crud"
    assert "exp-crud" in names(yard.js("experiment", "list"))
    assert "exp-crud" in yard.ok("experiment", "list", "-w", "default").stdout
    shown = yard.js("experiment", "show", "-n", "exp-crud")
    assert shown["name"] == "exp-crud" and shown["jobs"] == 0
    yard.ok("experiment", "delete", "-n", "exp-crud")
    assert "exp-crud" not in names(yard.js("experiment", "list"))


@pytest.mark.slow
def test_job_create_list_show_logs_files_delete(yard, cluster2, tmp_path):
    job_file = yard.write_job("flow", job_spec(FLOW_COMMAND, outputs={"MODEL": {}}))
    yard.ok("experiment", "create", "-n", "exp1", "-w", "default")
    submitted = yard.js("job", "create", "-f", str(job_file), "-n", "j1", "-c", cluster2,
                        "-w", "default", "-e", "exp1")
    assert submitted["name"] == "j1" and submitted["experiment"] == "exp1"
    assert submitted["cluster"] == cluster2
    assert submitted["state"] in ("queued", "preparing", "running", "succeeded")

    waited = yard.cli("job", "wait", "-n", "j1", "-e", "exp1", "-w", "default")
    assert waited.rc == 0, str(waited)
    assert "succeeded" in waited.stdout

    listed = yard.js("job", "list", "-e", "exp1")
    assert names(listed) == ["j1"]
    assert listed[0]["state"] == "succeeded" and listed[0]["exit_code"] == 0
    assert "j1" in yard.ok("job", "list", "-e", "exp1").stdout
    assert "j1" in names(yard.js("job", "list", "-c", cluster2))

    shown = yard.js("job", "show", "-n", "j1", "-e", "exp1")
    assert shown["state"] == "succeeded" and shown["nodes"] == 2
    assert shown["processes_per_node"] == 2 and shown["attempt"] == 1
    assert [a["number"] for a in shown["attempts"]] == [1]
    table = yard.ok("job", "show", "-n", "j1", "-e", "exp1").stdout
    assert "succeeded" in table

    logs = yard.ok("job", "logs", "-n", "j1", "-e", "exp1").stdout
    for rank, node in ((0, "local2-0"), (1, "local2-0"), (2, "local2-1"), (3, "local2-1")):
        assert f"[{node}/rank{rank}] hello rank {rank} of 4 on {node}" in logs, logs
        assert f"complaint from rank {rank}" in logs, logs
    node1 = yard.ok("job", "logs", "-n", "j1", "-e", "exp1", "--node", "local2-1").stdout
    assert "hello rank 2" in node1 and "hello rank 3" in node1
    assert "hello rank 0" not in node1 and "hello rank 1" not in node1
    by_rank_number = yard.ok("job", "logs", "-n", "j1", "-e", "exp1", "--node", "1").stdout
    assert by_rank_number == node1
    rank2 = yard.ok("job", "logs", "-n", "j1", "-e", "exp1", "--rank", "2").stdout
    assert "hello rank 2" in rank2
    assert all("rank2" in line for line in rank2.splitlines() if line), rank2
    only_out = yard.ok("job", "logs", "-n", "j1", "-e", "exp1", "--rank", "2",
                       "--stream", "stdout").stdout
    assert "hello rank 2" in only_out and "complaint" not in only_out
    followed = yard.ok("job", "logs", "-n", "j1", "-e", "exp1", "-f").stdout
    assert followed == logs  # -f on a finished job prints everything, then ends

    files = yard.js("job", "file", "list", "-n", "j1", "-e", "exp1")
    paths = {f["path"] for f in files["files"]}
    assert files["attempt"] == 1
    for rank, node in ((0, "local2-0"), (1, "local2-0"), (2, "local2-1"), (3, "local2-1")):
        assert f"stdouterr/{node}-rank{rank}.stdout.txt" in paths
        assert f"stdouterr/{node}-rank{rank}.stderr.txt" in paths
    assert "outputs/MODEL/model.txt" in paths
    assert "model.txt" in yard.ok("job", "file", "list", "-n", "j1", "-e", "exp1").stdout

    one = tmp_path / "one"
    saved = yard.js("job", "file", "download", "-n", "j1", "-e", "exp1",
                    "--path", "outputs/MODEL/model.txt", "--dest", str(one))
    assert [s["path"] for s in saved] == ["outputs/MODEL/model.txt"]
    assert (one / "outputs/MODEL/model.txt").read_text() == "the model\n"
    everything = tmp_path / "all"
    yard.ok("job", "file", "download", "-n", "j1", "-e", "exp1", "--dest", str(everything))
    assert "hello rank 3" in (everything / "stdouterr/local2-1-rank3.stdout.txt").read_text()
    missing = yard.cli("job", "file", "download", "-n", "j1", "-e", "exp1",
                       "--path", "outputs/nope", "--dest", str(tmp_path))
    assert missing.rc == 2 and "Traceback" not in missing.stderr, str(missing)

    assert yard.js("experiment", "show", "-n", "exp1")["jobs"] == 1
    yard.ok("job", "delete", "-n", "j1", "-e", "exp1")
    assert yard.js("job", "list", "-e", "exp1") == []
    gone = yard.cli("job", "show", "-n", "j1", "-e", "exp1")
    assert gone.rc == 3 and "Traceback" not in gone.stderr, str(gone)
    yard.ok("experiment", "delete", "-n", "exp1")


def test_default_workspace_and_experiment_and_create_wait(yard, cluster2):
    # no -w, -e or -c: default workspace, default experiment, the workspace's only cluster
    job_file = yard.write_job("defaults", job_spec('echo "streamed from rank $RANK"',
                                                   name="defaults-job"))
    run = yard.cli("job", "create", "-f", str(job_file), "--wait")
    assert run.rc == 0, str(run)
    for rank in range(4):
        assert f"streamed from rank {rank}" in run.stdout, str(run)
    assert "succeeded" in run.stdout
    shown = yard.js("job", "show", "-n", "defaults-job")
    assert shown["workspace"] == "default" and shown["experiment"] == "default"
    assert shown["cluster"] == cluster2 and shown["state"] == "succeeded"
    # a job over before the server saw it running still has a start time and a duration
    assert shown["started_at"] is not None and shown["duration"] is not None, shown
    assert shown["attempts"][0]["started_at"] is not None
    assert "defaults-job" in names(yard.js("job", "list"))


def test_job_exit_code_through_wait_and_create_wait(yard, cluster2):
    command = 'echo "before exit $RANK"; if [ "$RANK" = 1 ]; then exit 7; fi'
    job_file = yard.write_job("exit7", job_spec(command, ppn=1))
    run = yard.cli("job", "create", "-f", str(job_file), "-n", "exit7", "-c", cluster2,
                   "--wait")
    assert run.rc == 7, str(run)
    assert "before exit 1" in run.stdout, str(run)
    assert "failed" in run.stdout
    waited = yard.cli("job", "wait", "-n", "exit7")
    assert waited.rc == 7, str(waited)
    job = yard.js("job", "show", "-n", "exit7")
    assert job["state"] == "failed" and job["exit_code"] == 7
    # json mode of create --wait: logs go to stderr, the final job as JSON on stdout
    job_file = yard.write_job("exit7json", job_spec(command, ppn=1))
    run = yard.cli("job", "create", "-f", str(job_file), "-n", "exit7json", "-c", cluster2,
                   "--wait", "-o", "json")
    assert run.rc == 7, str(run)
    assert run.json()["exit_code"] == 7 and "before exit 1" in run.stderr


def test_terminate_then_delete(yard, cluster2):
    job_file = yard.write_job("term", job_spec("sleep 30", ppn=1, limits={"grace_period": 1}))
    yard.ok("job", "create", "-f", str(job_file), "-n", "term", "-c", cluster2)
    yard.wait_job("term", ("running",), timeout=30)
    busy = yard.cli("job", "delete", "-n", "term")
    assert busy.rc == 2 and "terminate" in busy.stderr, str(busy)
    ended = yard.js("job", "terminate", "-n", "term")
    assert ended["state"] == "canceled"
    waited = yard.cli("job", "wait", "-n", "term")
    assert waited.rc == 130, str(waited)
    assert yard.js("job", "terminate", "-n", "term")["state"] == "canceled"  # idempotent
    yard.ok("job", "delete", "-n", "term")
    assert "term" not in names(yard.js("job", "list"))


def test_dry_run_masks_secrets_and_runs_nothing(yard, cluster2):
    # the command rebuilds the secret from two halves, so only `secrets:` holds it whole
    check = ('[ "$API_KEY" = "$(printf %s%s ' + SECRET[:6] + " " + SECRET[6:] + ')" ] '
             '&& echo "secret arrived"')
    spec = job_spec(check, env={"PLAIN_SETTING": "visible-value"}, secrets={"API_KEY": SECRET})
    job_file = yard.write_job("dry", spec)
    text = job_file.read_text()
    assert text.count(SECRET) == 1  # the yaml holds it once (under secrets)

    dry = yard.ok("job", "create", "-f", str(job_file), "-n", "dry", "-c", cluster2,
                  "--dry-run")
    out = dry.stdout
    assert SECRET not in out + dry.stderr
    assert "# node 0: local2-0" in out and "# node 1: local2-1" in out
    for rank in range(4):
        assert f"rank {rank} (local {rank % 2}):" in out, out
    assert 'API_KEY="***"' in out
    assert 'PLAIN_SETTING="visible-value"' in out
    assert 'BATCHYARD_TOKEN="***"' in out
    assert 'RANK="3"' in out and 'WORLD_SIZE="4"' in out
    dry_json = yard.cli("job", "create", "-f", str(job_file), "-n", "dry", "-c", cluster2,
                        "--dry-run", "-o", "json")
    assert dry_json.rc == 0, str(dry_json)
    assert SECRET not in dry_json.stdout + dry_json.stderr
    assert dry_json.json()["dry_run"] is True
    assert "dry" not in names(yard.js("job", "list"))  # nothing was submitted

    # run for real: the rank gets the secret, nothing shows it back
    run = yard.cli("job", "create", "-f", str(job_file), "-n", "dry", "-c", cluster2, "--wait")
    assert run.rc == 0, str(run)
    assert run.stdout.count("secret arrived") == 4
    shown = yard.cli("job", "show", "-n", "dry", "-o", "json")
    assert SECRET not in shown.stdout
    assert shown.json()["spec"]["secrets"] == {"API_KEY": "***"}
    assert SECRET not in yard.ok("job", "logs", "-n", "dry").stdout
    assert SECRET not in yard.ok("job", "list", "-o", "json").stdout


def test_schema_job_prints_json_schema(yard):
    schema = json.loads(yard.ok("schema", "job").stdout)
    assert schema["type"] == "object"
    assert {"nodes", "distribution", "command", "limits", "secrets"} <= set(schema["properties"])
    assert schema.get("additionalProperties") is False
    assert schema["properties"]["nodes"]["minimum"] == 1


def test_server_status(yard):
    status = yard.js("server", "status")
    assert status["running"] is True and status["url"] == yard.url
    assert Path(status["home"]) == yard.home
