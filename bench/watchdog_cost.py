"""What the hang watchdog costs a running job: the CPU time of each node's launcher over the
same window of a 2x2 job, with ``limits.hang_timeout`` (the watchdog on: a look at the
ranks' log files every second, a status report when the node's idleness changes) and
without it. The ranks print a line a second (progress, so the watchdog never fires).

    python bench/watchdog_cost.py [--runs 3] [--seconds 20]

CPU time is the launcher's own (utime + stime of /proc/PID/stat, its threads included, its
ranks not), read at the start and the end of the window; the figure is per node, as a
share of one core."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import isolated_server, median

TICK = os.sysconf("SC_CLK_TCK")
TERMINAL = ("succeeded", "failed", "canceled")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def launcher_pids(client: Any, path: str) -> list[int]:
    deadline = time.time() + 120
    while time.time() < deadline:
        job = client.get(path)
        if job["state"] in TERMINAL:
            raise SystemExit(f"{path} ended early: {job['state']} {job.get('message')}")
        nodes = (job.get("attempts") or [{}])[-1].get("nodes") or []
        if job["state"] == "running" and len(nodes) == 2 and all(
                n.get("pid") and n["state"] == "running" for n in nodes):
            return [int(n["pid"]) for n in nodes]
        time.sleep(0.1)
    raise SystemExit(f"{path} did not run within 120 s")


def one_run(client: Any, name: str, watched: bool, seconds: float) -> float:
    """Mean launcher CPU per node over ``seconds``, as a fraction of one core."""
    limits: dict[str, Any] = {"grace_period": 1}
    if watched:
        limits["hang_timeout"] = 600
    spec = {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
            "command": f"for i in $(seq 1 {int(seconds) + 60}); do echo step $i; sleep 1; done",
            "limits": limits}
    client.post("/workspaces/default/jobs", {"spec": spec, "cluster": "c2", "name": name})
    path = client.job_path("default", "default", name)
    pids = launcher_pids(client, path)
    time.sleep(2.0)  # past the start-up (the first reports, the log files opening)
    before = [cpu_seconds(p) for p in pids]
    t0 = time.monotonic()
    time.sleep(seconds)
    used = [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
    wall = time.monotonic() - t0
    client.post(path + "/terminate")
    while client.get(path)["state"] not in TERMINAL:
        time.sleep(0.1)
    return sum(used) / len(used) / wall


def one_look() -> float:
    """Seconds of one look at a node's files (4 rank logs, one of them growing)."""
    import tempfile

    from batchyard.node.watchdog import Watchdog

    folder = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    logs = [folder / f"n0-rank{r}.{s}.txt" for r in range(2) for s in ("stdout", "stderr")]
    for log in logs:
        log.write_text("x\n")
    dog = Watchdog(folder, "n0", timeout=600.0, every=0.0)
    count = 20000
    took = 0.0
    for i in range(count):
        if i % 2:  # a rank wrote meanwhile (not timed)
            with logs[0].open("a") as fh:
                fh.write("y\n")
        t0 = time.perf_counter()
        dog.tick()
        took += time.perf_counter() - t0
    return took / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with isolated_server():
        from batchyard.client.http import Client

        client = Client.connect(quiet=True)
        client.post("/workspaces/default/clusters", {"name": "c2", "vm_size": "Standard_D2_v2",
                                                     "manual": {"target_node_count": 2}})
        deadline = time.time() + 60
        while time.time() < deadline:
            nodes = client.get("/workspaces/default/clusters/c2/nodes")
            if len([n for n in nodes if n["state"] == "idle"]) == 2:
                break
            time.sleep(0.2)
        off, on = [], []
        for i in range(args.runs):  # interleaved: a change of load hits both alike
            off.append(one_run(client, f"plain-{i}", False, args.seconds))
            on.append(one_run(client, f"watched-{i}", True, args.seconds))
    a, b = median(off), median(on)
    look = one_look()
    print(f"{args.runs} runs each, 2 nodes x 2 ranks, {args.seconds:g} s windows; launcher CPU "
          "per node (median, share of one core):")
    print(f"  without hang_timeout  {a * 100:6.2f} %")
    print(f"  with hang_timeout     {b * 100:6.2f} %   ratio {b / a:.2f}x "
          f"({(b - a) * 100:+.2f} points)")
    print(f"  one look at a node's log files {look * 1e6:.1f} us: once a "
          f"second, {look * 100:.4f} % of a core")


if __name__ == "__main__":
    main()
