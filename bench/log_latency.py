"""Write -> `job logs -f` latency: how long a line a rank prints takes to reach a client that
follows the job's logs, now that every line crosses the node channel (rank file on the node
-> launcher's shipper -> server's copy -> the follow stream).

A 1-node job prints ``N`` lines, each carrying the wall-clock time it was written, every
``--every`` seconds; the bench follows the job's logs through the API (as `job logs -f`
does) and records arrival - written for each line. Columns:

* local:    the embedded local backend (launcher on this machine, HTTP over loopback);
* machines: the same job on a `--backend machines` cluster whose node is a real
            `batchyard agent` process with its own work dir (the multi-host code path:
            join, heartbeat, ticket, launcher over the node channel; loopback network).
* bare:     the same script writing to a file that this process tails (the floor: what a
            tail -f of a local file costs).

    python bench/log_latency.py [--lines 200] [--every 0.02]

Target: p99 < 250 ms on the channel columns.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import isolated_server

PRINTER = ("import sys, time\n"
           "n, every = int(sys.argv[1]), float(sys.argv[2])\n"
           "for i in range(n):\n"
           "    print(f'LAT {i} {time.time():.6f}', flush=True)\n"
           "    time.sleep(every)\n")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def follow(client: object, name: str, want: int) -> list[float]:
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    lags: list[float] = []
    buf = b""
    for chunk in client.stream(client.job_path("default", "default", name) + "/logs",
                               follow=True, prefix=False):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        stamp = time.time()
        for line in lines:
            parts = line.decode(errors="replace").split()
            if len(parts) >= 3 and parts[0] == "LAT":
                lags.append(stamp - float(parts[2]))
        if len(lags) >= want:
            break
    return lags


def through(client: object, cluster: str, lines: int, every: float, script: Path,
            tag: str) -> list[float]:
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    name = f"lat-{tag}"
    spec = {"nodes": 1, "distribution": {"type": "custom"},
            "command": [sys.executable, str(script), str(lines), str(every)]}
    client.post("/workspaces/default/jobs", {"spec": spec, "cluster": cluster, "name": name})
    return follow(client, name, lines)


def bare(lines: int, every: float, script: Path) -> list[float]:
    out = Path(tempfile.mkdtemp()) / "out.txt"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, str(script), str(lines), str(every)],
                                stdout=fh)
    lags: list[float] = []
    offset, buf = 0, b""
    while len(lags) < lines:
        with open(out, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
        offset += len(data)
        buf += data
        *got, buf = buf.split(b"\n")
        stamp = time.time()
        for line in got:
            parts = line.split()
            if len(parts) >= 3:
                lags.append(stamp - float(parts[2]))
        time.sleep(0.1)  # the same poll period the server's follow loop uses
    proc.wait()
    return lags


def start_agent(client: object, work: Path) -> subprocess.Popen[bytes]:
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    client.post("/workspaces/default/clusters", {"name": "farm", "backend": "machines",
                                                 "vm_size": "Standard_D2_v2",
                                                 "manual": {"target_node_count": 0}})
    data = client.post("/workspaces/default/clusters/farm/join-tokens", {"ttl": 3600})
    argv = [sys.executable, "-m", "batchyard.cli.main", "agent", "--server", data["server"],
            "--join-token", data["token"], "--work-dir", str(work), "--name", "bench-node"]
    env = {k: v for k, v in os.environ.items() if k != "BATCHYARD_HOME"}
    log = open(work.parent / "agent.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    deadline = time.time() + 60
    while time.time() < deadline:
        nodes = client.get("/workspaces/default/clusters/farm").get("nodes") or []
        if any(n.get("state") == "idle" for n in nodes):
            return proc
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the agent did not join: {shlex.join(argv)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--every", type=float, default=0.02)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-lat-"))
    script = tmp / "printer.py"
    script.write_text(PRINTER)
    results: dict[str, list[float]] = {"bare": bare(args.lines, args.every, script)}
    with isolated_server():
        from batchyard.client.http import Client

        client = Client.connect(quiet=True)
        client.post("/workspaces/default/clusters", {"name": "local1",
                                                     "vm_size": "Standard_D2_v2",
                                                     "manual": {"target_node_count": 1}})
        results["local"] = through(client, "local1", args.lines, args.every, script, "local")
        agent = start_agent(client, tmp / "agent-work")
        try:
            results["machines"] = through(client, "farm", args.lines, args.every, script,
                                          "machines")
        finally:
            agent.terminate()
            threading.Timer(5, agent.kill).start()
            agent.wait()
        client.close()
    summary = {}
    print(f"write -> follower latency, {args.lines} lines every {args.every * 1000:.0f} ms:")
    for kind, lags in results.items():
        p50, p99 = pct(lags, 0.5) * 1000, pct(lags, 0.99) * 1000
        summary[kind] = {"p50_ms": round(p50, 1), "p99_ms": round(p99, 1), "n": len(lags)}
        print(f"  {kind:9s} p50 {p50:7.1f} ms   p99 {p99:7.1f} ms")
    for kind in ("local", "machines"):
        ratio = summary[kind]["p50_ms"] / max(summary["bare"]["p50_ms"], 0.1)
        summary[kind]["p50_ratio_vs_bare"] = round(ratio, 2)
    print("  target: p99 < 250 ms on local and machines")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
