"""What a Prometheus scrape of ``GET /metrics`` costs at 1,000 nodes and 10,000 jobs.

A temp home gets a store (SQLite, or ``--db URL``) holding 10 machines clusters of 100 nodes
(8 GPUs each), 1,000 running jobs (one per node, each with its launcher's report: ranks, a
utilisation sample of 8 GPUs, the job's GPU record with its chart series), 1,000 queued jobs
with their pending reasons and 8,000 ended ones; agents' samples on every node. Then the real
server serves it and /metrics is scraped over HTTP on loopback.

Figures: wall time per scrape (p50, p99), the server's CPU per scrape (the thread time of the
request, which the server reports in ``X-Scrape-Cpu-Seconds``: a figure the machine's load
does not inflate as it does wall time) and that as a share of a core when Prometheus scrapes
every 15 s. The bare tool in the same run: prometheus-client rendering a
registry of plain gauges with as many samples and labels, no database (the ratio says what
batchyard adds to the library's own cost). Budgets: 100 ms a scrape, 1 % of a core.

    python bench/metrics_scrape.py [--nodes 1000] [--jobs 10000] [--scrapes 30] [--db URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

INTERVAL = 15.0
GPUS = 8


def _report(node: str, gpus: int, stamp: float) -> dict[str, Any]:
    util = {"ts": stamp, "cpu_percent": 71.5, "job_cpu_cores": 5.2, "job_rss_bytes": 40 << 30,
            "mem_used_bytes": 90 << 30, "mem_total_bytes": 256 << 30, "mem_percent": 35.1,
            "gpus": [{"index": i, "util_percent": 87.0, "mem_used_mb": 61000,
                      "mem_total_mb": 81559} for i in range(gpus)]}
    record = {"gpus": {str(i): {"mean": 85.2, "p10": 60, "samples": 4000, "mem_max_mb": 61000,
                                "mem_total_mb": 81559} for i in range(gpus)},
              "series": {"t0": stamp - 20000, "step": 320.0,
                         "gpus": {str(i): [87] * 60 for i in range(gpus)}}, "idle": None}
    ranks = [{"rank": r, "local_rank": r, "pid": 1000 + r, "what": "rank", "exit_code": None}
             for r in range(gpus)]
    from batchyard.node.usage import summary

    return {"node_rank": 0, "node": node, "pid": 999, "state": "running", "ranks": ranks,
            "started_at": stamp - 20000, "running_at": stamp - 19990, "updated_at": stamp,
            "util": util, "scrape": {**summary(util), "lag": 0.0}, "gpu": record,
            "execs": {}}


def build(db_url: str, nodes: int, jobs: int) -> dict[str, int]:
    from sqlalchemy import insert, select

    from batchyard.store.db import Database
    from batchyard.store.models import (
        Attempt,
        Cluster,
        Experiment,
        Job,
        Node,
        NodeReport,
        Workspace,
    )

    db = Database(db_url)
    db.migrate()
    # the samples stay "fresh" for the whole run (the server leaves out older ones)
    stamp = time.time() + 3600
    running = min(nodes, jobs)
    queued = min(jobs - running, jobs // 10)
    with db.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        exp = Experiment(workspace_id=ws.id, name="bench")
        s.add(exp)
        per = 100
        clusters = []
        for c in range((nodes + per - 1) // per):
            cluster = Cluster(workspace_id=ws.id, name=f"farm{c}", backend="machines",
                              spec={"heartbeat_timeout": 1e9}, size={"vcpus": 64,
                                                                      "gpus": GPUS},
                              target_nodes=min(per, nodes - c * per), state="steady")
            s.add(cluster)
            clusters.append(cluster)
        s.flush()
        workspace_id, experiment_id = ws.id, exp.id
        cluster_ids = [c.id for c in clusters]
    from batchyard.server.services.gpu_usage import machine_sample

    usage = machine_sample({"ts": stamp, "cpu_percent": 70.0, "mem_used_bytes": 90 << 30,
                            "mem_total_bytes": 256 << 30, "mem_percent": 35.2,
                            "gpus": [{"index": i, "util_percent": 87.0, "mem_used_mb": 61000,
                                      "mem_total_mb": 81559} for i in range(GPUS)]})
    node_rows = [{"cluster_id": cluster_ids[i // 100], "name": f"farm{i // 100}-{i % 100}",
                  "index": i % 100, "address": f"10.0.{i // 250}.{i % 250}",
                  "state": "running", "resources": {"cpus": 64, "gpus": GPUS,
                                                    "gpu_ids": list(range(GPUS))},
                  "directory": "/srv/by", "heartbeat_at": stamp, "usage": usage,
                  "created_at": time.time()} for i in range(nodes)]
    states = ["running"] * running + ["queued"] * queued
    states += [("succeeded", "failed", "canceled")[i % 3] for i in range(jobs - len(states))]
    reasons = ["waiting for 1 idle node: 0 idle, 100 running",
               "quota: standardNCFamily 800/800 vCPUs in use in workspace 1 (needs 64 more)",
               "waiting behind job 5 (higher priority), expected to start in about 2.0 h"]
    job_rows = [{"workspace_id": workspace_id, "experiment_id": experiment_id,
                 "cluster_id": cluster_ids[(i % nodes) // 100], "name": f"job-{i}",
                 "spec": {"name": f"job-{i}", "command": "python train.py", "nodes": 1},
                 "state": state, "attempt": 1 if state != "queued" else 0,
                 "pending_reason": reasons[i % 3] if state == "queued" else None,
                 "cancel_requested": False, "directory": f"/srv/by/jobs/job-{i}",
                 "submitted_at": time.time(), "priority": 1, "source_format": "native"}
                for i, state in enumerate(states)]
    with db.session() as s:
        s.execute(insert(Node), node_rows)
        for start in range(0, len(job_rows), 2000):
            s.execute(insert(Job), job_rows[start:start + 2000])
    with db.session() as s:
        node_ids = list(s.scalars(select(Node.id).order_by(Node.id)))
        names = dict(s.execute(select(Node.id, Node.name)).all())
        run_ids = list(s.scalars(select(Job.id).where(Job.state == "running").order_by(Job.id)))
        attempts = [{"job_id": job_id, "number": 1, "uuid": f"bench-{job_id}",
                     "state": "running", "node_ids": [node_ids[i]],
                     "handle": {"nodes": [names[node_ids[i]]]}, "directory": "/srv/by/a",
                     "created_at": stamp, "started_at": stamp - 20000}
                    for i, job_id in enumerate(run_ids)]
        s.execute(insert(Attempt), attempts)
    with db.session() as s:
        rows = s.execute(select(Attempt.id, Attempt.node_ids)).all()
        s.execute(insert(NodeReport), [
            {"attempt_id": aid, "node_rank": 0, "node_id": ids[0], "token_hash": "x" * 64,
             "seq": 1, "state": "running", "data": _report(names[ids[0]], GPUS, stamp),
             "created_at": stamp, "updated_at": stamp} for aid, ids in rows])
        for nid in node_ids[:running]:
            s.get(Node, nid).job_id = run_ids[node_ids.index(nid)]  # type: ignore[union-attr]
    return {"nodes": nodes, "jobs": jobs, "running": running, "queued": queued}


def bare_render(samples: int, labels: int) -> float:
    """prometheus-client alone: a registry of plain gauges with as many samples."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class Plain:
        def collect(self) -> Any:
            family = GaugeMetricFamily("bare_gauge", "a gauge",
                                       labels=[f"l{i}" for i in range(labels)])
            for n in range(samples):
                family.add_metric([f"value-{n}"] * labels, 42.0)
            yield family

    registry = CollectorRegistry()
    registry.register(Plain())
    times = []
    for _ in range(10):
        began = time.thread_time()  # CPU, as the server's figure: the machine's load aside
        generate_latest(registry)
        times.append(time.thread_time() - began)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--scrapes", type=int, default=30)
    parser.add_argument("--db", default=None, help="a PostgreSQL URL (default: SQLite)")
    args = parser.parse_args()
    import httpx

    home = Path(tempfile.mkdtemp(prefix="batchyard-bench-scrape-"))
    os.environ["BATCHYARD_HOME"] = str(home)
    for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN"):
        os.environ.pop(key, None)
    if args.db:
        os.environ["BATCHYARD_DB_URL"] = args.db
    from batchyard.client import local_server
    from batchyard.config import database_url

    began = time.perf_counter()
    shape = build(database_url(), args.nodes, args.jobs)
    print(f"store: {shape} in {time.perf_counter() - began:.1f}s", flush=True)
    info = local_server.start(port=0)
    url = info.url + "/metrics"
    try:
        with httpx.Client(timeout=60) as http:
            for _ in range(3):  # warm: the first scrape imports and compiles
                text = http.get(url).text
            samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
            walls, cpus = [], []
            for _ in range(args.scrapes):
                start = time.perf_counter()
                answer = http.get(url)
                walls.append(time.perf_counter() - start)
                assert answer.status_code == 200, answer.text
                cpus.append(float(answer.headers["X-Scrape-Cpu-Seconds"]))
    finally:
        local_server.stop()
    walls.sort()
    p50, p99 = statistics.median(walls), walls[min(len(walls) - 1, int(0.99 * len(walls)))]
    per_scrape = statistics.median(cpus)
    bare = bare_render(samples, 3)
    share = 100.0 * per_scrape / INTERVAL
    print(f"scrape: {samples} samples, {len(text) / 1024:.0f} KiB")
    print(f"batchyard /metrics over HTTP: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms "
          f"(budget 100 ms: {'ok' if p99 <= 0.1 else 'OVER'})")
    print(f"server CPU per scrape (its request thread): p50 {per_scrape * 1000:.1f} ms "
          f"(budget 100 ms: {'ok' if per_scrape <= 0.1 else 'OVER'}); scraped every "
          f"{INTERVAL:g}s: {share:.2f} % of a core (budget 1 %: "
          f"{'ok' if share <= 1.0 else 'OVER'})")
    print(f"bare prometheus-client, {samples} gauges x 3 labels, no database: "
          f"{bare * 1000:.1f} ms of CPU -> batchyard/bare = {per_scrape / bare:.2f}x")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
