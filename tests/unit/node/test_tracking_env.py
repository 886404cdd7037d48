"""The MLflow variables every rank gets (node/tracking.py): batchyard's own tracking with the
job's token and run, or the workspace's external server with tags naming the job and no
batchyard token; what the node's own environment held is never what a rank sees."""

from __future__ import annotations

import pytest

from batchyard.launchplan import NodePlan
from batchyard.node.env import merged_environ
from batchyard.node.tracking import tracking_env


def plan(mlflow: dict[str, str] | None, api_url: str | None = "http://10.0.0.5:8742",
         ca_file: str | None = None) -> NodePlan:
    return NodePlan(job_id=7, job_name="j", workspace="w", experiment="exp", attempt=1,
                    attempt_uuid="u", node_rank=0, node_names=["a"], node_addrs=["127.0.0.1"],
                    distribution={"type": "custom"}, command="true", prepare=None,
                    attempt_dir="/tmp/x", node_dir="/tmp", checkpoint_dir="/tmp/c",
                    master_addr="127.0.0.1", master_port=1, api_url=api_url,
                    api_token="job.secret", ca_file=ca_file, mlflow=mlflow)


def test_batchyard_tracks_with_the_jobs_token_and_run() -> None:
    assert tracking_env(plan({"run_id": "00000007abc"})) == {
        "MLFLOW_TRACKING_URI": "http://10.0.0.5:8742", "MLFLOW_TRACKING_TOKEN": "job.secret",
        "MLFLOW_EXPERIMENT_NAME": "exp", "MLFLOW_RUN_ID": "00000007abc"}
    https = tracking_env(plan({"run_id": "r"}, api_url="https://h:1", ca_file="/ca.pem"))
    assert https["MLFLOW_TRACKING_SERVER_CERT_PATH"] == "/ca.pem"
    assert "MLFLOW_RUN_ID" not in tracking_env(plan(None))  # an older server's plan


def test_an_external_server_gets_no_batchyard_token() -> None:
    env = tracking_env(plan({"tracking_uri": "http://mlflow:5000",
                             "run_context": '{"batchyard.job_id": "7"}'}))
    assert env == {"MLFLOW_TRACKING_URI": "http://mlflow:5000",
                   "MLFLOW_EXPERIMENT_NAME": "exp",
                   "MLFLOW_RUN_CONTEXT": '{"batchyard.job_id": "7"}'}


def test_nothing_without_a_server() -> None:
    assert tracking_env(plan(None, api_url=None)) == {}


def test_the_machines_own_settings_never_reach_a_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "the-operators")
    monkeypatch.setenv("MLFLOW_RUN_ID", "stale")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/srv/batchyard/prometheus")
    env = merged_environ({"MLFLOW_RUN_ID": "the-jobs"})
    assert "MLFLOW_TRACKING_TOKEN" not in env and "PROMETHEUS_MULTIPROC_DIR" not in env
    assert env["MLFLOW_RUN_ID"] == "the-jobs"
