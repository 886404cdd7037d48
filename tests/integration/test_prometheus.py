"""/metrics scraped by a real Prometheus (Debian's, on loopback, started and stopped by pid):
once with the scrape token (`batchyard server token --scrape`) and once with none (the server
listens on loopback); the test asks Prometheus's HTTP API for batchyard's series after a real
job ran. The shipped alert rules pass promtool's check and unit tests, and every query of the
shipped Grafana dashboard is valid PromQL that Prometheus answers."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

import promkit
import strictkit
from yardkit import CLUSTER, Yard

pytestmark = [pytest.mark.timeout(300),
              strictkit.requires(not promkit.available(),
                                 "Prometheus is not installed (scripts/setup.sh)")]
DOCS = Path(__file__).resolve().parents[2] / "docs"
DATA = Path(__file__).resolve().parents[1] / "data" / "prometheus"


def _target(url: str) -> str:
    return url.split("://", 1)[1]


@pytest.fixture(scope="module")
def ran(yard: Yard, cluster2: str) -> dict[str, Any]:
    path = yard.write_job("metrics-job", {
        "name": "metrics-job", "cluster": CLUSTER, "nodes": 2,
        "command": "echo multiproc=${PROMETHEUS_MULTIPROC_DIR:-none}"})
    yard.ok("job", "create", "-f", str(path))
    return yard.wait_job("metrics-job", timeout=90)


@pytest.fixture(scope="module")
def prometheus(yard: Yard, ran: dict[str, Any],
               tmp_path_factory: pytest.TempPathFactory) -> Any:
    token = yard.ok("server", "token", "--scrape").stdout.strip()
    folder = tmp_path_factory.mktemp("prometheus")
    (folder / "token").write_text(token + "\n")
    scrape = [{"job_name": "batchyard", "static_configs": [{"targets": [_target(yard.url)]}],
               "authorization": {"credentials_file": str(folder / "token")}},
              {"job_name": "batchyard-loopback",
               "static_configs": [{"targets": [_target(yard.url)]}]}]
    with promkit.Prometheus(folder, scrape) as prom:
        yield prom


def test_prometheus_scrapes_the_server(prometheus: promkit.Prometheus,
                                       ran: dict[str, Any]) -> None:
    assert ran["state"] == "succeeded"
    found = promkit.wait_for(prometheus, 'batchyard_jobs{job="batchyard",state="succeeded",'
                                         f'cluster="{CLUSTER}"}} >= 1')
    assert found[0]["metric"]["workspace"] == "default"
    promkit.wait_for(prometheus, "count(up == 1) == 2")  # both scrape jobs
    up = prometheus.query("up == 1")
    assert {r["metric"]["job"] for r in up} == {"batchyard", "batchyard-loopback"}
    nodes = promkit.wait_for(prometheus, f'batchyard_nodes{{job="batchyard",cluster="{CLUSTER}"'
                                         ',state="idle"}')
    assert float(nodes[0]["value"][1]) == 2
    submits = promkit.wait_for(prometheus, "batchyard_submit_latency_seconds_count > 0")
    assert float(submits[0]["value"][1]) >= 1
    promkit.wait_for(prometheus, "batchyard_scheduling_pass_seconds_count > 0")


def test_ranks_never_see_the_servers_metric_files(yard: Yard, ran: dict[str, Any]) -> None:
    """Regression: the server's PROMETHEUS_MULTIPROC_DIR reached the ranks of local jobs, so
    a job's own prometheus-client wrote into (or failed on) the server's files."""
    logs = yard.ok("job", "logs", "metrics-job").stdout
    assert logs.count("multiproc=none") == 2, logs


def test_tokens(yard: Yard) -> None:
    token = yard.ok("server", "token", "--scrape").stdout.strip()
    assert token == yard.js("server", "token", "--scrape")["token"]
    assert token != yard.token
    assert httpx.get(yard.url + "/metrics", headers={"Authorization": f"Bearer {token}"}
                     ).status_code == 200
    wrong = httpx.get(yard.url + "/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
    assert httpx.get(yard.url + "/api/v1/workspaces",
                     headers={"Authorization": f"Bearer {token}"}).status_code == 401
    plain = httpx.get(yard.url + "/metrics")  # loopback, no token
    assert plain.status_code == 200
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    names = set(re.findall(r"^# TYPE (\S+) ", plain.text, re.M))
    for family in ("batchyard_jobs", "batchyard_queued_jobs", "batchyard_nodes",
                   "batchyard_submit_latency_seconds", "batchyard_scheduling_pass_seconds",
                   "batchyard_node_cpu_utilization_percent",
                   "batchyard_node_gpu_utilization_percent",
                   "batchyard_node_gpu_memory_used_bytes",
                   "batchyard_node_memory_utilization_percent",
                   "batchyard_job_gpu_utilization_percent",
                   "batchyard_log_shipping_lag_seconds"):
        assert family in names, family
    open_metrics = httpx.get(yard.url + "/metrics",
                             headers={"Accept": "application/openmetrics-text"})
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")


def test_node_channel_errors_are_counted(yard: Yard) -> None:
    bad = httpx.post(yard.url + "/api/v1/node/attempts/nope/nodes/0/logs", json={"files": {}},
                     headers={"Authorization": "Bearer launch.nope.0.x"})
    assert bad.status_code in (401, 403, 404)
    text = httpx.get(yard.url + "/metrics").text
    assert re.search(r'batchyard_node_channel_errors_total\{call="logs",code="'
                     + str(bad.status_code) + r'"\} [1-9]', text), text[-2000:]


def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    shutil.copy(DOCS / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    shutil.copy(DATA / "alerts_test.yml", tmp_path / "alerts_test.yml")
    for argv in (["promtool", "check", "rules", "alerts.yml"],
                 ["promtool", "test", "rules", "alerts_test.yml"]):
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_queries_are_answered(prometheus: promkit.Prometheus) -> None:
    dashboard = json.loads((DOCS / "grafana" / "batchyard-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    assert len(exprs) >= 15
    promkit.wait_for(prometheus, "batchyard_jobs")
    for expr in exprs:
        query = expr.replace("$workspace", ".*").replace("$cluster", ".*")
        if query.startswith("label_values("):
            inner = query[len("label_values("):query.rindex(",")]
            query = f"count({inner})"
        prometheus.query(query)  # a 400 (bad PromQL) fails the test
