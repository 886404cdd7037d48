"""What running jobs cost the machine outside the jobs themselves: the server's CPU (its
reconciler, the node channel) and the node launchers' CPU while N quiet jobs run (``sleep``:
the ranks use nothing), against the same server with nothing running, in alternated rounds.
The anchor is what the bare tools cost while a job runs: nothing (a `sleep` under torchrun or
srun has no server beside it); the target (issue 37) is the server under 2 % of a core with 10
jobs running.

    python bench/server_cpu.py [--jobs 0,1,10] [--seconds 20] [--rounds 2] [--profile]

CPU is utime + stime (/proc) of the server process and of every launcher, read at the start
and the end of a window that begins once every job runs; each figure is a share of one core,
min/median/max over the rounds, with the load average. ``--profile`` records the server with
py-spy (bench/_pyspy.py) in the last window of the largest N."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import isolated_server, load
from watchdog_cost import cpu_seconds

TERMINAL = ("succeeded", "failed", "canceled")


def running(client: Any, names: list[str]) -> list[int]:
    """The launcher pids of ``names`` once every one runs."""
    deadline = time.time() + 180
    while time.time() < deadline:
        pids: list[int] = []
        for name in names:
            job = client.get(client.job_path("default", "default", name))
            nodes = (job.get("attempts") or [{}])[-1].get("nodes") or []
            if job["state"] != "running" or not all(n.get("pid") for n in nodes):
                break
            pids += [int(n["pid"]) for n in nodes]
        else:
            return pids
        time.sleep(0.2)
    raise SystemExit(f"not every one of {len(names)} jobs ran within 180 s")


def window(client: Any, count: int, tag: str, seconds: float, server: int,
           profile: bool) -> dict[str, Any]:
    names = [f"{tag}-{i}" for i in range(count)]
    for name in names:
        client.post("/workspaces/default/jobs", {"spec": {
            "nodes": 1, "distribution": {"type": "custom"}, "command": "sleep 3600",
            "limits": {"grace_period": 1}}, "cluster": "c10", "name": name})
    pids = running(client, names)
    time.sleep(3.0)  # past the start-up: the first reports, the log files opening
    s0, l0 = cpu_seconds(server), [cpu_seconds(p) for p in pids]
    t0 = time.monotonic()
    spy = None
    if profile:
        from _pyspy import record

        spy = record([server], seconds * 0.9)
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    wall = time.monotonic() - t0
    out = {"server": (cpu_seconds(server) - s0) / wall,
           "launchers": sum(cpu_seconds(p) - b for p, b in zip(pids, l0, strict=True)) / wall,
           "load": load(), "profile": spy}
    for name in names:
        client.post(client.job_path("default", "default", name) + "/terminate")
    for name in names:
        while client.get(client.job_path("default", "default", name))["state"] not in TERMINAL:
            time.sleep(0.2)
    time.sleep(2.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", default="0,1,10",
                        type=lambda s: [int(x) for x in s.split(",") if x])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    got: dict[int, list[dict[str, Any]]] = {n: [] for n in args.jobs}
    with isolated_server():
        from batchyard.client.http import Client
        from batchyard.config import read_server_info

        client = Client.connect(quiet=True)
        info = read_server_info()
        assert info is not None and info.pid is not None
        client.post("/workspaces/default/clusters", {"name": "c10", "vm_size": "Standard_D2_v2",
                                                     "manual": {"target_node_count": max(
                                                         [*args.jobs, 1])}})
        time.sleep(5.0)
        for r in range(args.rounds):
            order = args.jobs if r % 2 == 0 else list(reversed(args.jobs))
            for n in order:
                last = args.profile and r == args.rounds - 1 and n == max(args.jobs)
                got[n].append(window(client, n, f"r{r}n{n}", args.seconds, info.pid, last))
                print(f"  round {r + 1}, {n} jobs: server {got[n][-1]['server']:.2%}, "
                      f"launchers {got[n][-1]['launchers']:.2%} of a core; load "
                      f"{got[n][-1]['load']}", flush=True)
    print(f"CPU while N quiet jobs run ({args.seconds:g} s windows, {args.rounds} alternated "
          "rounds), share of one core min/median/max:")
    result: dict[str, Any] = {}
    for n, runs in got.items():
        srv = [x["server"] for x in runs]
        lau = [x["launchers"] for x in runs]
        print(f"  {n:3d} jobs: server {min(srv):6.2%} {statistics.median(srv):6.2%} "
              f"{max(srv):6.2%}   launchers {min(lau):6.2%} {statistics.median(lau):6.2%} "
              f"{max(lau):6.2%}" + ("   (target: server < 2 %)" if n == 10 else ""))
        result[str(n)] = {"server": [min(srv), statistics.median(srv), max(srv)],
                     "launchers": [min(lau), statistics.median(lau), max(lau)],
                     "load": [x["load"] for x in runs]}
        for x in runs:
            if x.get("profile"):
                print(f"py-spy of the server with {n} jobs running:\n{x['profile']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
