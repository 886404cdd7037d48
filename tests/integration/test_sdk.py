"""The batchyard Python SDK against a real server and real jobs: workspaces, clusters,
experiments, code snapshots, live logs, files, tags, and metrics logged from inside jobs
(4 ranks; the job token's scope; values kept on disk while the server is down, sent after
it comes back). Also the metrics migration and the `job metrics` CLI command."""

from __future__ import annotations

import io
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from batchyard import errors
from batchyard.sdk import (
    Experiment,
    Job,
    Workspace,
    command_job,
    python_job,
    pytorch_job,
    set_default_client,
)
from batchyard.spec.job import JobSpec

pytestmark = pytest.mark.timeout(240)
WS = "sdk-ws"
CLUSTER = "sdk-c2"


@pytest.fixture(scope="module")
def sdk(yard) -> Iterator[Workspace]:
    """This process's SDK pointed at the module's server; a workspace with a 2-node cluster."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHYARD_HOME", str(yard.home))
        for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN", "BATCHYARD_API"):
            mp.delenv(key, raising=False)
        set_default_client(None)
        ws = Workspace.create(WS, location="westeurope", subscription_id="sub-1",
                              resource_group="rg-1")
        ws.create_cluster(CLUSTER, vm_size="Standard_D2_v2", nodes=2)
        yield ws
        set_default_client(None)


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def test_workspace_cluster_experiment_objects(sdk: Workspace) -> None:
    again = Workspace.get(WS)
    assert (again.subscription_id, again.resource_group, again.location) == \
        ("sub-1", "rg-1", "westeurope")
    assert WS in [w.name for w in Workspace.list_all()]
    with pytest.raises(errors.NotFound):
        Workspace.get("no-such-ws")
    assert Workspace.create(WS, exist_ok=True).name == WS
    with pytest.raises(errors.Conflict):
        Workspace.create(WS)

    cluster = sdk.cluster(CLUSTER)
    assert cluster.wait_ready(timeout=30)["current_nodes"] == 2
    assert [n["name"] for n in cluster.nodes()] == [f"{CLUSTER}-0", f"{CLUSTER}-1"]
    auto = sdk.create_cluster("sdk-auto", vm_size="Standard_D2_v2", min_nodes=0, max_nodes=3,
                              initial_nodes=1, idle_seconds_before_scaledown=60)
    assert auto.data["scale"]["autoscale"]["max_nodes"] == 3
    assert auto.data["current_nodes"] == 1
    assert {c.name for c in sdk.clusters()} == {CLUSTER, "sdk-auto"}
    auto.delete()

    exp = sdk.experiment("sdk-exp")
    assert exp.name in [e.name for e in sdk.experiments()]
    assert Experiment.create(sdk, "sdk-exp", exist_ok=True).data["name"] == "sdk-exp"


def test_submit_snapshot_logs_files_tags(sdk: Workspace, yard) -> None:
    code = write(yard.work / "sdk-code", {
        "run.py": """\
            import os, pathlib
            assert not os.path.exists("ignored.txt"), "snapshot kept an ignored file"
            assert os.path.exists("kept.txt")
            rank = os.environ["RANK"]
            print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}", flush=True)
            out = pathlib.Path(os.environ["BATCHYARD_OUTPUT_MODEL"])
            (out / f"weights-{rank}.txt").write_text(f"rank {rank}\\n")
            """,
        ".gitignore": "*.txt\n",
        ".amlignore": "ignored.txt\n",  # wins over .gitignore, as in Azure ML
        "kept.txt": "kept\n", "ignored.txt": "never shipped\n"})
    spec = pytorch_job("run.py", nodes=2, processes_per_node=1, outputs=["MODEL"],
                       tags={"owner": "sdk-test"})
    job = sdk.experiment("sdk-exp").submit(spec, code=code, name="snap1", cluster=CLUSTER)
    (code / "run.py").write_text("raise SystemExit('edited after submit')\n")  # too late
    out = io.StringIO()
    final = job.wait(timeout=90, show_output=True, out=out)
    assert final["state"] == "succeeded", out.getvalue()
    logs = out.getvalue()
    assert f"[{CLUSTER}-0/rank0] hello from rank 0 of 2" in logs
    assert f"[{CLUSTER}-1/rank1] hello from rank 1 of 2" in logs
    assert "hello from rank 1" in "".join(job.logs(rank=1))

    paths = {f["path"] for f in job.files()}
    assert {"outputs/MODEL/weights-0.txt", "outputs/MODEL/weights-1.txt"} <= paths
    one = job.download("outputs/MODEL/weights-1.txt", yard.work / "dl-one" / "w.txt")
    assert one.read_text() == "rank 1\n"
    into_dir = job.download("outputs/MODEL/weights-0.txt", yard.work)
    assert into_dir == yard.work / "weights-0.txt"
    saved = job.download_all(yard.work / "dl-all", prefix="outputs/MODEL")
    assert sorted(p.name for p in saved) == ["weights-0.txt", "weights-1.txt"]

    assert job.tags() == {"owner": "sdk-test"}
    assert job.set_tags({"stage": "done", "owner": None}) == {"stage": "done"}
    same = Job.get("snap1", "sdk-exp", WS)
    assert same.data["state"] == "succeeded" and same.tags() == {"stage": "done"}
    assert "snap1" in [j.name for j in sdk.experiment("sdk-exp").jobs()]


def test_snapshot_size_limit_is_a_clear_error(sdk: Workspace, yard) -> None:
    code = write(yard.work / "big-code", {"run.py": "print(1)\n", "data.bin": "x" * 4096})
    with pytest.raises(errors.SpecError, match="snapshot limit"):
        sdk.experiment("sdk-exp").submit(python_job("run.py"), code=code, cluster=CLUSTER,
                                         snapshot_limit=1024)


METRICS_SCRIPT = """\
    import os, batchyard
    from batchyard.sdk.metrics import flush, log_list, log_row
    rank = int(os.environ["RANK"])
    for step in range(5):
        batchyard.log_metric("loss", 1.0 / (step + 1) + rank, step=step)
    batchyard.log_metric("rank_seen", rank)
    log_list("pair", [rank, rank * 10])
    log_row("per_rank", rank=rank, world=int(os.environ["WORLD_SIZE"]))
    if rank < 2:
        assert flush(30)  # ranks 2 and 3 leave it to the flush at exit
    """


def test_metrics_from_four_ranks_read_back(sdk: Workspace, yard) -> None:
    code = write(yard.work / "metrics-code", {"m.py": METRICS_SCRIPT})
    job = sdk.experiment("sdk-exp").submit(
        pytorch_job("m.py", nodes=2, processes_per_node=2), code=code, name="metrics4",
        cluster=CLUSTER)
    assert job.wait(timeout=90)["state"] == "succeeded", "".join(job.logs())
    rows = job.metrics()
    assert len(rows) == 4 * 8
    assert sorted(job.metric_values("rank_seen")) == [0, 1, 2, 3]
    losses = job.metrics("loss")
    assert {(r["rank"], r["step"]) for r in losses} == {(k, s) for k in range(4)
                                                        for s in range(5)}
    for r in losses:
        assert r["value"] == pytest.approx(1.0 / (r["step"] + 1) + r["rank"])
        assert r["attempt"] == 1 and r["kind"] == "scalar"
    assert sorted(r["value"] for r in job.metrics("pair")) == [[0, 0], [1, 10], [2, 20],
                                                               [3, 30]]
    assert {r["value"]["world"] for r in job.metrics("per_rank")} == {4}
    newest = rows[-1]["id"]
    assert job.metrics(after=newest) == []

    table = yard.ok("job", "metrics", "-n", "metrics4", "-w", WS, "-e", "sdk-exp").stdout
    assert "rank_seen" in table and "loss" in table and "20" in table  # 20 loss values
    as_json = yard.js("job", "metrics", "-n", "metrics4", "-w", WS, "-e", "sdk-exp",
                      "-m", "loss")
    assert len(as_json) == 20 and {r["name"] for r in as_json} == {"loss"}
    shown = yard.ok("job", "show", "-n", "metrics4", "-w", WS, "-e", "sdk-exp").stdout
    assert "metrics" in shown and "rank_seen" in shown


def test_job_token_reaches_only_its_own_job(sdk: Workspace, yard) -> None:
    script = """\
        import os, httpx
        api, token = os.environ["BATCHYARD_API"], os.environ["BATCHYARD_TOKEN"]
        headers = {"Authorization": f"Bearer {token}"}
        base = f"{api}/api/v1/workspaces/{os.environ['BATCHYARD_WORKSPACE']}/experiments/"
        exp, name = os.environ["BATCHYARD_EXPERIMENT"], os.environ["BATCHYARD_JOB_NAME"]
        mine = base + f"{exp}/jobs/{name}"
        other = base + "sdk-exp/jobs/metrics4"
        body = {"metrics": [{"name": "x", "value": 1}]}
        codes = {
            "own_post": httpx.post(mine + "/metrics", json=body, headers=headers).status_code,
            "own_get": httpx.get(mine + "/metrics", headers=headers).status_code,
            "own_tags": httpx.post(mine + "/tags", json={"tags": {"a": "b"}},
                                   headers=headers).status_code,
            "other_post": httpx.post(other + "/metrics", json=body, headers=headers).status_code,
            "other_get": httpx.get(other + "/metrics", headers=headers).status_code,
            "admin_route": httpx.get(f"{api}/api/v1/workspaces", headers=headers).status_code,
        }
        print(codes)
        assert codes == {"own_post": 201, "own_get": 200, "own_tags": 200, "other_post": 403,
                         "other_get": 403, "admin_route": 401}, codes
        """
    code = write(yard.work / "token-code", {"t.py": script})
    job = sdk.experiment("sdk-exp").submit(
        command_job(["python", "t.py"], distribution="custom"), code=code, name="token1",
        cluster=CLUSTER)
    assert job.wait(timeout=60)["state"] == "succeeded", "".join(job.logs())
    assert job.metric_values("x") == [1.0]
    assert job.tags() == {"a": "b"}
    assert len(Job.get("metrics4", "sdk-exp", WS).metrics()) == 32  # untouched


def test_admin_logs_metrics_and_deleting_a_job_deletes_them(sdk: Workspace, yard) -> None:
    job = sdk.experiment("sdk-exp").submit(command_job("true", distribution="custom"),
                                           name="to-delete", cluster=CLUSTER)
    job.wait(timeout=60)
    job.log_metric("note", float("nan"))
    job.log_metric("series", [1.5, float("inf")], kind="list")
    values = job.latest_metrics()
    assert values["note"] != values["note"]  # NaN survives the JSON round trip
    assert values["series"] == [1.5, float("inf")]
    job.delete()
    with pytest.raises(errors.NotFound):
        job.metrics()


def test_metrics_migration_upgrade_and_downgrade(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import inspect

    from batchyard.store.db import MIGRATIONS, Database

    db = Database(f"sqlite:///{tmp_path / 'm.db'}")
    db.migrate()
    assert "metrics" in inspect(db.engine).get_table_names()
    columns = {c["name"] for c in inspect(db.engine).get_columns("metrics")}
    assert {"job_id", "attempt", "name", "value", "data", "step", "rank", "ts"} <= columns
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0001")
    assert "metrics" not in inspect(db.engine).get_table_names()
    db.migrate()
    assert "metrics" in inspect(db.engine).get_table_names()


def test_metrics_kept_while_the_server_is_down(sdk: Workspace, yard) -> None:
    """Runs last: it stops the module's server and starts it again on the same port."""
    sync, mount = yard.exchange("sync")  # the rank writes there too
    script = """\
        import os, pathlib, time, batchyard
        from batchyard.sdk import metrics
        sync = pathlib.Path(os.environ["SYNC"])
        def wait(name):
            while not (sync / name).exists():
                time.sleep(0.05)
        batchyard.log_metric("phase", 1)
        assert metrics.flush(10)
        (sync / "a").touch()
        wait("b")  # the server is down now
        batchyard.log_metric("phase", 2)
        batchyard.log_metric("phase", 3)
        ok = metrics.flush(1.0)
        spool = metrics.reporter().spool.path
        (sync / "c").write_text(f"{ok} {spool.exists()}")
        wait("d")  # the server is back
        assert metrics.flush(30)
        print("spool left:", spool.exists())
        """
    code = write(yard.work / "restart-code", {"r.py": script})
    spec = command_job(["python", "r.py"], distribution="custom", env={"SYNC": str(sync)})
    spec = JobSpec.model_validate({**spec.model_dump(exclude_none=True), "mounts": [mount]})
    job = sdk.experiment("sdk-exp").submit(spec, code=code, name="restart1", cluster=CLUSTER)
    port = urlparse(yard.url).port
    deadline = time.monotonic() + 60
    while not (sync / "a").exists():
        assert time.monotonic() < deadline, "".join(job.logs())
        time.sleep(0.05)
    yard.ok("server", "stop")
    (sync / "b").touch()
    while not (sync / "c").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (sync / "c").read_text() == "False True"  # not sent; kept in the spool file
    yard.ok("server", "start", "--port", str(port))
    yard._reset_http()
    set_default_client(None)
    (sync / "d").touch()
    final = job.wait(timeout=60)
    assert final["state"] == "succeeded", "".join(job.logs())
    assert sorted(job.metric_values("phase")) == [1.0, 2.0, 3.0]  # each exactly once
    assert "spool left: False" in "".join(job.logs())
    assert os.environ["BATCHYARD_HOME"] == str(yard.home)
