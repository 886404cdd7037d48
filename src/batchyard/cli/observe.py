"""What `job show` adds about a job's observability: the params it logged, its GPUs'
utilisation (mean and p10 per GPU) and its MLflow run, with a link: the job's portal page for
batchyard's own tracking, else the run on the workspace's MLflow server (found there by its
``batchyard.job_id`` tag, with the MLFLOW_TRACKING_* credentials of this shell if any)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from batchyard.cli.common import console, table

if TYPE_CHECKING:
    from batchyard.client.http import Client

LOOKUP_TIMEOUT = 3.0


def add_links(c: Client, job: dict[str, Any]) -> None:
    view = job.get("mlflow")
    if not isinstance(view, dict):
        return
    if view.get("external"):
        view["run_url"] = external_run_url(view)
        return
    from batchyard.sdk.job import portal_path

    view["tracking_uri"] = c.url
    if job.get("workspace") and job.get("experiment"):
        view["run_url"] = c.url.rstrip("/") + portal_path(job["workspace"], job["experiment"],
                                                          job["name"])


def _auth() -> dict[str, str]:
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = (os.environ.get("MLFLOW_TRACKING_USERNAME"),
                      os.environ.get("MLFLOW_TRACKING_PASSWORD"))
    if user and password:
        import base64

        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}
    return {}


def external_run_url(view: dict[str, Any]) -> str | None:
    """The run's page on the external MLflow server; its experiment's page when the run is
    not found (not started yet), the server itself when that cannot be asked."""
    import httpx

    base = str(view.get("tracking_uri") or "").rstrip("/")
    if not base:
        return None
    tag_key, tag_value = next(iter((view.get("run_tag") or {}).items()), (None, None))
    try:
        with httpx.Client(base_url=base, timeout=LOOKUP_TIMEOUT, headers=_auth()) as http:
            found = http.get("/api/2.0/mlflow/experiments/get-by-name",
                             params={"experiment_name": view.get("experiment") or ""})
            if found.status_code != 200:
                return base
            exp_id = found.json()["experiment"]["experiment_id"]
            runs = http.post("/api/2.0/mlflow/runs/search", json={
                "experiment_ids": [exp_id], "max_results": 1,
                "filter": f"tags.`{tag_key}` = '{tag_value}'"})
            rows = (runs.json().get("runs") or []) if runs.status_code == 200 else []
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return base
    if not rows:
        return f"{base}/#/experiments/{quote(str(exp_id))}"
    run_id = rows[0]["info"]["run_id"]
    view["run_id"] = run_id
    return f"{base}/#/experiments/{quote(str(exp_id))}/runs/{quote(str(run_id))}"


def render(j: dict[str, Any]) -> None:
    params = j.get("params") or {}
    if params:
        table([{"name": k, "value": v} for k, v in sorted(params.items())],
              [("name", "Param"), ("value", "Value", "text")], title="Params")
    gpus = j.get("gpu_usage") or []
    if gpus:
        rows = [{**g, "mean_": _percent(g.get("mean")), "p10_": _percent(g.get("p10")),
                 "memory": _memory(g)} for g in gpus]
        table(rows, [("node", "Node"), ("gpu", "GPU", "num"), ("mean_", "Mean", "num"),
                     ("p10_", "P10", "num"), ("samples", "Samples", "num"),
                     ("memory", "Memory (max / total)", "num")],
              title=f"GPU utilisation (attempt {gpus[0].get('attempt')})")
    from batchyard.cli.common import human_time

    for event in j.get("events") or []:
        if event.get("to") == "gpus-idle":  # server/services/gpu_usage.py
            console.print(f"{event.get('message')} ({human_time(event.get('ts'))})",
                          highlight=False, markup=False, soft_wrap=True)
    view = j.get("mlflow")
    if isinstance(view, dict) and (view.get("run_id") or view.get("external")):
        where = view.get("run_url") or view.get("tracking_uri") or ""
        what = f"run {view['run_id']}" if view.get("run_id") else "run"
        server = "on " + str(view.get("tracking_uri")) if view.get("external") else \
            "in batchyard"
        console.print(f"MLflow: {what} {server}" + (f": {where}" if where else ""),
                      highlight=False, markup=False, soft_wrap=True)


def _percent(value: Any) -> str:
    return "-" if value is None else f"{float(value):g} %"


def _memory(g: dict[str, Any]) -> str:
    used, total = g.get("memory_max_mb"), g.get("memory_total_mb")
    if used is None:
        return "-"
    return f"{used} / {total} MiB" if total else f"{used} MiB"
