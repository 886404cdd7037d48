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
* hosts:    (``--hosts``, root) across hosts that share no disk: the server in one network
            namespace (tests/hostkit.py), the agent and the rank in another, the follower
            on the server host; HTTPS between them.
* bare:     the same script writing to a local file that this process tails, polling every
            100 ms like `tail -f` (what following a file costs without any channel).

    python bench/log_latency.py [--lines 200] [--every 0.02] [--hosts]

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
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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


def across_hosts(lines: int, every: float, script: Path, tmp: Path) -> list[float]:
    """Server host + agent host (network namespaces with private work dirs); this script's
    ``--follow`` mode runs on the server host, since no host is reachable from here."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from hostkit import HostNet

    home = tmp / "hosts-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHYARD_")}
    env["BATCHYARD_HOME"] = str(home)
    cli = [sys.executable, "-m", "batchyard.cli.main"]
    with HostNet() as net:
        server, node = net.add_host("server"), net.add_host("node1", hide=[home])
        started = server.run([*cli, "server", "start", "--host", server.addr, "--port",
                              "18743"], env=env, timeout=90)
        env["BATCHYARD_SERVER"] = f"https://{server.addr}:18743"  # never a loopback one
        if started.returncode != 0:
            raise RuntimeError(started.stderr)
        try:
            for argv in (["cluster", "create", "-n", "farm", "--backend", "machines", "-s",
                          "Standard_D2_v2"], ["cluster", "join-command", "-n", "farm",
                                              "-o", "json"]):
                res = server.run([*cli, *argv], env=env, timeout=60)
                if res.returncode != 0:
                    raise RuntimeError(res.stderr)
            line = shlex.split(json.loads(res.stdout)["command"])
            agent_env = {k: v for k, v in env.items() if not k.startswith("BATCHYARD_")}
            agent = node.popen([*cli, *line[1:], "--work-dir", "/var/lib/batchyard/agent"],
                               env=agent_env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            res = server.run([sys.executable, __file__, "--follow", "--lines", str(lines),
                              "--every", str(every), "--script", str(script)], env=env,
                             timeout=300)
            agent.terminate()
            if res.returncode != 0:
                raise RuntimeError(res.stderr[-2000:])
            lags: list[float] = json.loads(res.stdout.strip().splitlines()[-1])
            return lags
        finally:
            server.run([*cli, "server", "stop"], env=env, timeout=30)


def follow_here(lines: int, every: float, script: Path) -> None:
    """``--follow``: on the server host, wait for the agent's node and follow one job."""
    from batchyard.client.http import Client

    client = Client.connect(autostart=False, quiet=True)
    deadline = time.time() + 60
    while not any(n.get("state") == "idle" for n in
                  client.get("/workspaces/default/clusters/farm").get("nodes") or []):
        if time.time() > deadline:
            raise SystemExit("the agent did not join")
        time.sleep(0.2)
    print(json.dumps(through(client, "farm", lines, every, script, "hosts")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--every", type=float, default=0.02)
    parser.add_argument("--hosts", action="store_true", help="add the across-hosts column "
                        "(root: network namespaces)")
    parser.add_argument("--follow", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--script", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.follow:
        follow_here(args.lines, args.every, args.script)
        return
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
    if args.hosts:
        results["hosts"] = across_hosts(args.lines, args.every, script, tmp)
    summary = {}
    print(f"write -> follower latency, {args.lines} lines every {args.every * 1000:.0f} ms:")
    for kind, lags in results.items():
        p50, p99 = pct(lags, 0.5) * 1000, pct(lags, 0.99) * 1000
        summary[kind] = {"p50_ms": round(p50, 1), "p99_ms": round(p99, 1), "n": len(lags)}
        print(f"  {kind:9s} p50 {p50:7.1f} ms   p99 {p99:7.1f} ms")
    for kind in [k for k in ("local", "machines", "hosts") if k in summary]:
        ratio = summary[kind]["p50_ms"] / max(summary["bare"]["p50_ms"], 0.1)
        summary[kind]["p50_ratio_vs_bare"] = round(ratio, 2)
    print("  target: p99 < 250 ms on every channel column")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
