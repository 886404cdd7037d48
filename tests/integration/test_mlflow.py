"""MLflow, unchanged, in jobs on a real server: the real `mlflow` client (PyPI's package) in
the ranks logs metrics, params, tags and artifacts that land on the job (its metrics, params,
tags and outputs: `job show`, `job metrics`, `job file list`, the SDK), autolog() of a
scikit-learn fit, an Azure ML v2 command job's log_metric and log_artifact, several ranks on
one run; a job token cannot write another job's run; a call batchyard does not implement is
MLflow's ENDPOINT_NOT_FOUND; a workspace naming a real `mlflow server` (SQLite, started by
the test and stopped by pid) sends its jobs' runs there and `job show` links the run."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import promkit
import strictkit
from yardkit import CLUSTER, Yard, wait_until

mlflow = strictkit.importorskip("mlflow")
pytestmark = pytest.mark.timeout(300)

LOGGING = '''
import os, tempfile
import mlflow
from mlflow import MlflowClient
assert os.environ["MLFLOW_TRACKING_TOKEN"] == os.environ["BATCHYARD_TOKEN"]
assert os.environ["MLFLOW_TRACKING_URI"] == os.environ["BATCHYARD_API"]
assert os.environ["MLFLOW_EXPERIMENT_NAME"] == os.environ["BATCHYARD_EXPERIMENT"]
mlflow.set_experiment("somewhere-else")  # a job's run stays in its own experiment
with mlflow.start_run() as run:
    mlflow.log_param("lr", 0.01)
    mlflow.log_params({"batch": 32, "optimizer": "adam"})
    mlflow.set_tag("phase", "train")
    for step in range(5):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    mlflow.log_metrics({"acc": 0.9, "f1": 0.8}, step=4)
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "note.txt"), "w") as fh:
        fh.write("hello artifacts")
    mlflow.log_artifact(os.path.join(folder, "note.txt"))
    os.makedirs(os.path.join(folder, "plots", "a"))
    with open(os.path.join(folder, "plots", "a", "p.csv"), "w") as fh:
        fh.write("x,y\\n1,2\\n")
    mlflow.log_artifacts(os.path.join(folder, "plots"), artifact_path="plots")
    client = MlflowClient()
    history = client.get_metric_history(run.info.run_id, "loss")
    print("HISTORY", [(m.step, m.value) for m in history])
    print("LISTED", sorted(f.path for f in client.list_artifacts(run.info.run_id)))
    back = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                               artifact_path="note.txt")
    print("DOWNLOADED", open(back).read())
    print("RUN", run.info.run_id, run.info.experiment_id,
          mlflow.get_experiment(run.info.experiment_id).name)
'''

AUTOLOG = '''
import mlflow
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
mlflow.autolog()
X, y = load_digits(return_X_y=True)
model = LogisticRegression(max_iter=300, C=0.5).fit(X, y)
print("SCORE", model.score(X, y))
'''

AML_TRAIN = '''
import os, mlflow
for epoch in range(3):
    mlflow.log_metric("val_loss", 0.5 - 0.1 * epoch, step=epoch)
with open("summary.txt", "w") as fh:
    fh.write("epochs: 3")
mlflow.log_artifact("summary.txt")
print("done")
'''

AML_JOB = '''
$schema: https://azuremlschemas.azureedge.net/latest/commandJob.schema.json
type: command
display_name: aml-mlflow
experiment_name: aml-exp
code: .
command: python train.py
environment: azureml:AzureML-sklearn-1.5@latest
compute: azureml:{cluster}
'''


def _submit(yard: Yard, name: str, script: str, *, experiment: str = "default",
            workspace: str = "default", cluster: str = CLUSTER,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    path = yard.write_job(name, {"name": name, "experiment": experiment, "cluster": cluster,
                                 "code": ".", "command": "python train.py", **(extra or {})},
                          {"train.py": script})
    yard.ok("job", "create", "-f", str(path), "-w", workspace)
    return yard.wait_job(name, timeout=180, experiment=experiment, workspace=workspace)


def _logs(yard: Yard, name: str, *args: str) -> str:
    return yard.ok("job", "logs", name, *args).stdout


@pytest.fixture(scope="module")
def logged(yard: Yard, cluster2: str) -> dict[str, Any]:
    job = _submit(yard, "logged", LOGGING)
    assert job["state"] == "succeeded", _logs(yard, "logged")
    return job


def test_calls_land_on_the_job(yard: Yard, logged: dict[str, Any]) -> None:
    out = _logs(yard, "logged")
    assert "HISTORY [(0, 1.0), (1, 0.5), (2, 0.3333333333333333), (3, 0.25), (4, 0.2)]" in out
    assert "LISTED ['note.txt', 'plots']" in out and "DOWNLOADED hello artifacts" in out
    assert logged["mlflow"]["run_id"] in out and " default" in out
    metrics = yard.js("job", "metrics", "logged")
    loss = [(m["step"], m["value"]) for m in metrics if m["name"] == "loss"]
    assert loss == [(0, 1.0), (1, 0.5), (2, 1 / 3), (3, 0.25), (4, 0.2)]
    assert {m["name"] for m in metrics} == {"loss", "acc", "f1"}
    assert logged["params"] == {"lr": "0.01", "batch": "32", "optimizer": "adam"}
    assert logged["spec"]["tags"]["phase"] == "train"
    files = {f["path"]: f["size"] for f in yard.js("job", "file", "list", "logged")["files"]}
    assert files["outputs/mlflow/note.txt"] == len("hello artifacts")
    assert "outputs/mlflow/plots/a/p.csv" in files
    shown = yard.ok("job", "show", "logged").stdout
    assert "optimizer" in shown and f"MLflow: run {logged['mlflow']['run_id']}" in shown


def test_the_sdk_reads_mlflow_metrics(yard: Yard, logged: dict[str, Any]) -> None:
    code = ("import batchyard, json; job = batchyard.Workspace.get('default')"
            ".experiment('default').job('logged'); "
            "print(json.dumps([job.latest_metrics(), job.params()]))")
    proc = subprocess.run([sys.executable, "-c", code], env=yard.env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert '"loss": 0.2' in proc.stdout and '"optimizer": "adam"' in proc.stdout, proc.stdout


def test_the_admin_token_reads_runs_with_the_client(yard: Yard,
                                                    logged: dict[str, Any]) -> None:
    code = f'''
import os, mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
client = MlflowClient()
run = client.get_run("{logged["mlflow"]["run_id"]}")
print("PARAMS", sorted(run.data.params.items()), "STATUS", run.info.status)
print("EXPERIMENT", client.get_experiment_by_name("default").experiment_id)
try:
    client.create_run("1")
except MlflowException as exc:
    print("CREATE", exc.error_code)
try:
    client.get_run("0" * 32)
except MlflowException as exc:
    print("MISSING", exc.error_code)
'''
    env = {**yard.env, "MLFLOW_TRACKING_URI": yard.url, "MLFLOW_TRACKING_TOKEN": yard.token}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "PARAMS [('batch', '32'), ('lr', '0.01'), ('optimizer', 'adam')] STATUS FINISHED" \
        in proc.stdout
    assert "CREATE INVALID_PARAMETER_VALUE" in proc.stdout
    assert "MISSING RESOURCE_DOES_NOT_EXIST" in proc.stdout


def test_every_rank_logs_to_the_one_run(yard: Yard, cluster2: str) -> None:
    script = ("import os, mlflow\n"
              "mlflow.log_metric('rank_seen', float(os.environ['RANK']))\n")
    job = _submit(yard, "ranks", script,
                  extra={"nodes": 2, "distribution": {"type": "pytorch"}})
    assert job["state"] == "succeeded", _logs(yard, "ranks")
    values = sorted(m["value"] for m in yard.js("job", "metrics", "ranks")
                    if m["name"] == "rank_seen")
    assert values == [0.0, 1.0]


@pytest.mark.slow
def test_autolog_of_a_scikit_learn_fit(yard: Yard, cluster2: str) -> None:
    job = _submit(yard, "autolog", AUTOLOG)
    assert job["state"] == "succeeded", _logs(yard, "autolog")
    names = {m["name"] for m in yard.js("job", "metrics", "autolog")}
    assert {"training_accuracy_score", "training_f1_score"} <= names, names
    assert job["params"]["C"] == "0.5" and job["params"]["max_iter"] == "300"
    assert job["spec"]["tags"].get("mlflow.autologging") == "sklearn"
    files = [f["path"] for f in yard.js("job", "file", "list", "autolog")["files"]]
    assert any(p.startswith("outputs/mlflow-models/") and p.endswith("/MLmodel")
               for p in files), files


def test_an_azure_ml_v2_command_job_logs_both(yard: Yard, cluster2: str) -> None:
    folder = yard.work / "jobs" / "aml"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(AML_TRAIN)
    (folder / "job.yml").write_text(AML_JOB.format(cluster=CLUSTER))
    yard.ok("job", "create", "-f", str(folder / "job.yml"))
    job = yard.wait_job("aml-mlflow", timeout=180, experiment="aml-exp")
    assert job["state"] == "succeeded"
    metrics = yard.js("job", "metrics", "aml-mlflow", "-e", "aml-exp")
    assert [(m["step"], round(m["value"], 6)) for m in metrics if m["name"] == "val_loss"] \
        == [(0, 0.5), (1, 0.4), (2, 0.3)]
    listed = yard.js("job", "file", "list", "aml-mlflow", "-e", "aml-exp")["files"]
    assert "outputs/mlflow/summary.txt" in {f["path"] for f in listed}
    target = yard.work / "aml-download"
    yard.ok("job", "file", "download", "aml-mlflow", "-e", "aml-exp", "-p",
            "outputs/mlflow/summary.txt", "-d", str(target))
    assert (target / "outputs" / "mlflow" / "summary.txt").read_text() == "epochs: 3"


def test_a_job_token_cannot_write_another_jobs_run(yard: Yard,
                                                   logged: dict[str, Any]) -> None:
    other = logged["mlflow"]["run_id"]
    script = f'''
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
client = MlflowClient()
for call in (lambda: client.log_metric("{other}", "stolen", 1.0),
             lambda: client.log_param("{other}", "stolen", "x"),
             lambda: client.get_run("{other}")):
    try:
        call()
        print("ALLOWED")
    except MlflowException as exc:
        print("REFUSED", exc.error_code)
try:
    client.search_registered_models()
except MlflowException as exc:
    print("UNSUPPORTED", exc.error_code)
'''
    job = _submit(yard, "thief", script)
    out = _logs(yard, "thief")
    assert job["state"] == "succeeded", out
    assert out.count("REFUSED PERMISSION_DENIED") == 3 and "ALLOWED" not in out, out
    assert "UNSUPPORTED ENDPOINT_NOT_FOUND" in out, out
    assert "stolen" not in {m["name"] for m in yard.js("job", "metrics", "logged")}
    assert "stolen" not in yard.job("logged")["params"]


def test_errors_have_mlflows_shape(yard: Yard, logged: dict[str, Any]) -> None:
    auth = {"Authorization": f"Bearer {yard.token}"}
    run = logged["mlflow"]["run_id"]
    for body in ({"run_id": run, "key": "x", "value": 10 ** 400},
                 {"run_id": run, "key": "x", "value": "high"},
                 {"run_id": run, "key": "x", "value": 1, "step": -1},
                 {"run_id": run, "key": "", "value": 1}):
        refused = httpx.post(yard.url + "/api/2.0/mlflow/runs/log-metric", headers=auth,
                             content=json.dumps(body))
        assert refused.status_code == 400, (body, refused.text)
        assert refused.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    searched = httpx.post(yard.url + "/api/2.0/mlflow/runs/search", headers=auth,
                          json={"experiment_ids": 7, "max_results": "many"})
    assert searched.status_code == 400
    missing = httpx.post(yard.url + "/api/2.0/mlflow/registered-models/create",
                         json={"name": "m"}, headers=auth)
    assert missing.status_code == 404
    assert missing.json()["error_code"] == "ENDPOINT_NOT_FOUND"
    anonymous = httpx.get(yard.url + "/api/2.0/mlflow/experiments/get-by-name",
                          params={"experiment_name": "default"})
    assert anonymous.status_code == 401
    assert anonymous.json()["error_code"] == "UNAUTHENTICATED"
    bad = httpx.post(yard.url + "/api/2.0/mlflow/runs/log-metric", headers=auth,
                     json={"run_id": "nope", "key": "x", "value": 1})
    assert bad.status_code == 404 and bad.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    garbled = httpx.post(yard.url + "/api/2.0/mlflow/runs/log-batch", headers=auth,
                         content=b"{not json")
    assert garbled.status_code == 400
    assert garbled.json()["error_code"] == "INVALID_PARAMETER_VALUE"


# --- an external MLflow server ---------------------------------------------------------------

@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = promkit.free_port()
    log = open(folder / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
         "--artifacts-destination", str(folder / "artifacts"), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=folder,
        start_new_session=True)
    log.close()
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, (folder / "server.log").read_text()[-3000:]
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url + "/health", timeout=2).status_code == 200
        return False

    try:
        wait_until(up, 120, 0.5, "mlflow server to answer")
        yield url
    finally:
        import os
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # its group: its workers and job consumers
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group outlived it
        proc.wait()


@pytest.mark.slow
def test_a_workspace_can_name_an_external_server(yard: Yard, mlflow_server: str) -> None:
    refused = yard.cli("workspace", "update", "default", "--mlflow-uri", "ftp://nowhere")
    assert refused.rc == 2 and "mlflow_uri" in refused.stderr, str(refused)
    assert yard.js("workspace", "show", "default")["mlflow_uri"] is None
    yard.ok("workspace", "create", "ext")
    yard.ok("cluster", "create", "-n", "ext1", "-w", "ext", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("ext1", 1, workspace="ext")
    updated = yard.js("workspace", "update", "ext", "--mlflow-uri", mlflow_server + "/")
    assert updated["mlflow_uri"] == mlflow_server
    script = ('import os, mlflow\n'
              'assert "MLFLOW_TRACKING_TOKEN" not in os.environ\n'
              'print("URI", os.environ["MLFLOW_TRACKING_URI"])\n'
              'mlflow.log_param("where", "outside")\n'
              'mlflow.log_metric("outside_loss", 0.25, step=1)\n')
    job = _submit(yard, "outside", script, workspace="ext", cluster="ext1")
    assert job["state"] == "succeeded", yard.ok("job", "logs", "outside", "-w", "ext").stdout
    assert f"URI {mlflow_server}" in yard.ok("job", "logs", "outside", "-w", "ext").stdout
    assert yard.js("job", "metrics", "outside", "-w", "ext") == []  # they went there
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("default")
    runs = client.search_runs([exp.experiment_id],
                              filter_string=f"tags.`batchyard.job_id` = '{job['id']}'")
    assert len(runs) == 1 and runs[0].data.params == {"where": "outside"}
    assert runs[0].data.metrics == {"outside_loss": 0.25}
    run_id = runs[0].info.run_id
    shown = yard.js("job", "show", "outside", "-w", "ext")["mlflow"]
    assert shown["run_url"] == f"{mlflow_server}/#/experiments/{exp.experiment_id}/runs/{run_id}"
    assert run_id in yard.ok("job", "show", "outside", "-w", "ext").stdout
    yard.ok("workspace", "update", "ext", "--mlflow-uri", "")
    assert yard.js("workspace", "show", "ext")["mlflow_uri"] is None

