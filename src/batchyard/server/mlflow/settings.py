"""Where a job's ranks send their MLflow calls: batchyard's own tracking API (the server's
URL, the job's token, its run) or the external MLflow server its workspace names
(``workspace update --mlflow-uri``), which gets tags naming the job instead (through
``MLFLOW_RUN_CONTEXT``) and never the job's token."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.orm import Session

from batchyard.errors import SpecError
from batchyard.server.mlflow import ids
from batchyard.store.models import Experiment, Job, Workspace

JOB_TAG = "batchyard.job_id"
MAX_URI = 2048


def check_uri(value: str) -> str:
    """An http(s) URL of an MLflow tracking server ('' clears it)."""
    text = value.strip()
    if not text:
        return ""
    parts = urlsplit(text)
    if len(text) > MAX_URI or parts.scheme not in ("http", "https") or not parts.netloc \
            or any(c.isspace() or c == "\x00" for c in text) or parts.query or parts.fragment:
        raise SpecError(f"mlflow_uri: {value[:80]!r} is not the http(s) URL of an MLflow "
                        "tracking server (e.g. http://mlflow.example:5000)")
    return text.rstrip("/")


def plan_settings(session: Session, job: Job, experiment: str) -> dict[str, Any]:
    """What the node plan carries for the ranks' MLflow variables (node/tracking.py)."""
    ws = session.get(Workspace, job.workspace_id)
    if ws is not None and ws.mlflow_uri:
        context = {JOB_TAG: str(job.id), "batchyard.job": job.name,
                   "batchyard.workspace": ws.name, "batchyard.experiment": experiment}
        return {"tracking_uri": ws.mlflow_uri, "run_context": json.dumps(context)}
    return {"run_id": ids.run_id(job)}


def job_view(job: Job, ws: Workspace | None, exp: Experiment | None) -> dict[str, Any]:
    """``job show``'s ``mlflow``: the run of the job, here or on the workspace's server (the
    CLI finds that run by its ``batchyard.job_id`` tag)."""
    if ws is not None and ws.mlflow_uri:
        return {"external": True, "tracking_uri": ws.mlflow_uri,
                "experiment": exp.name if exp is not None else None,
                "run_tag": {JOB_TAG: str(job.id)}}
    return {"external": False, "run_id": ids.run_id(job),
            "experiment_id": str(job.experiment_id)}
