"""The MLflow variables of every rank (standard library only: the launcher runs under
``python -S``): the tracking server (batchyard's own, or the one the workspace names), the
job's experiment, and with batchyard's own the job's token and run, so unchanged
``mlflow.log_metric`` calls land on the job. A variable the job sets itself is kept."""

from __future__ import annotations

from typing import Any


def tracking_env(plan: Any) -> dict[str, str]:
    settings: dict[str, Any] = dict(plan.mlflow or {})
    env = {"MLFLOW_EXPERIMENT_NAME": plan.experiment}
    external = settings.get("tracking_uri")
    if external:  # never the job's token: it is batchyard's credential
        env["MLFLOW_TRACKING_URI"] = str(external)
        if settings.get("run_context"):
            env["MLFLOW_RUN_CONTEXT"] = str(settings["run_context"])
        return env
    if not plan.api_url:
        return {}
    env["MLFLOW_TRACKING_URI"] = plan.api_url
    if plan.api_token:
        env["MLFLOW_TRACKING_TOKEN"] = plan.api_token
    if settings.get("run_id"):
        env["MLFLOW_RUN_ID"] = str(settings["run_id"])
    if plan.ca_file and plan.api_url.startswith("https:"):
        env["MLFLOW_TRACKING_SERVER_CERT_PATH"] = plan.ca_file
    return env
