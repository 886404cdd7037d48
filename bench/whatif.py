"""`batchyard job create --what-if` at 10,000 queued jobs (issue 35 §4: "answers within a
second at 10k queued jobs"), beside anchors in the same run.

A cluster of 2 nodes that take an hour to provision keeps every job queued; 10,000 queued
one-node jobs with a one-hour wall clock are inserted through the store (bench/_prefill.py),
so the estimate walks and books all of them. Timed, alternated round by round:

* the CLI: `job create -f job.yaml --what-if -o json` (a process, as a script runs it: the
  quick path) and in words (the whole CLI), against `batchyard cluster show q -o json` (a
  plain read of the same server: the anchor);
* the API: POST .../jobs/what-if, against GET .../clusters/q;
* `job show` of the last queued job over the API (its estimate walks the queue; answers
  are kept 5 s while the queue is unchanged, so every run here waits that out).

Printed: p50/p99 (and max) of each, the ratios to the anchors, the load average; the target
is a CLI p99 under 1 s.

    python bench/whatif.py [--queued 10000] [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _harness import isolated_server, load
from cli_startup import _batchyard, _env

JOB = {"name": "template", "nodes": 1, "distribution": {"type": "custom"},
       "command": "sleep 3600", "limits": {"max_wall_clock": 3600}}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def figures(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(values) * 1000, 1),
            "p99_ms": round(pct(values, 0.99) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1)}


def timed_cli(argv: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="whatif-bench-"))
    job_file = work / "job.yaml"
    job_file.write_text(json.dumps({**JOB, "name": "probe", "command": "true"}))
    by = _batchyard()  # the installed script, .pyc files kept (as cli_startup.py runs it)
    result: dict[str, Any] = {"load": [load()], "queued": args.queued}
    with isolated_server() as home:
        env = {**_env(), "BATCHYARD_HOME": str(home)}
        from _prefill import prefill

        from batchyard.client.http import Client
        from batchyard.config import database_url

        client = Client.connect(quiet=True)
        client.post("/workspaces/default/clusters", {
            "name": "q", "vm_size": "Standard_D2_v2", "manual": {"target_node_count": 2},
            "provisioning_delay": 3600})
        client.post("/workspaces/default/jobs", {"spec": JOB, "cluster": "q",
                                                 "name": "template"})
        took = prefill(database_url(), args.queued - 1, "many", "q")
        print(f"prefilled {args.queued - 1} queued jobs in {took:.1f} s", flush=True)
        last = f"many-{args.queued - 2}"
        what_if = [*by, "job", "create", "-f", str(job_file), "-c", "q", "--what-if",
                   "-o", "json"]
        words = what_if[:-2]  # in words: the whole CLI (Rich)
        anchor = [*by, "cluster", "show", "q", "-o", "json"]
        answer = json.loads(subprocess.run(what_if, env=env, check=True, capture_output=True,
                                           text=True).stdout)
        print(f"what-if answer: start in {answer['wait_seconds']:.0f} s, "
              f"{answer['ahead']} jobs ahead", flush=True)
        got: dict[str, list[float]] = {k: [] for k in (
            "cli what-if -o json", "cli what-if (words)", "cli anchor (cluster show)",
            "api what-if", "api anchor (GET cluster)", "api job show (estimate)")}
        body = {"spec": {**JOB, "name": "probe"}, "cluster": "q"}
        for _ in range(args.runs):
            got["cli what-if -o json"].append(timed_cli(what_if, env))
            got["cli what-if (words)"].append(timed_cli(words, env))
            got["cli anchor (cluster show)"].append(timed_cli(anchor, env))
            began = time.perf_counter()
            client.post("/workspaces/default/jobs/what-if", body)
            got["api what-if"].append(time.perf_counter() - began)
            began = time.perf_counter()
            client.get("/workspaces/default/clusters/q")
            got["api anchor (GET cluster)"].append(time.perf_counter() - began)
        for _ in range(max(3, args.runs // 4)):
            time.sleep(5.1)  # past the kept answer
            began = time.perf_counter()
            shown = client.get(f"/workspaces/default/experiments/many/jobs/{last}")
            got["api job show (estimate)"].append(time.perf_counter() - began)
        result["last_job_ahead"] = shown.get("estimate", {}).get("ahead")
        client.close()
    for name, values in got.items():
        result[name] = figures(values)
    result["ratio cli what-if / anchor (p50)"] = round(
        statistics.median(got["cli what-if -o json"]) / statistics.median(
            got["cli anchor (cluster show)"]), 2)
    result["ratio api what-if / anchor (p50)"] = round(
        statistics.median(got["api what-if"]) / statistics.median(
            got["api anchor (GET cluster)"]), 2)
    result["target cli p99 < 1 s"] = result["cli what-if -o json"]["p99_ms"] < 1000
    result["load"].append(load())
    for name in got:
        f = result[name]
        print(f"{name:32s} p50 {f['p50_ms']:8.1f} ms  p99 {f['p99_ms']:8.1f} ms  "
              f"max {f['max_ms']:8.1f} ms")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
