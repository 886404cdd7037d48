"""Write -> `job logs -f` latency: how long a line a rank prints takes to reach a client that
follows the job's logs, now that every line crosses the node channel (rank file on the node
-> launcher's shipper -> server's copy -> the follow stream).

A 1-node job prints ``N`` lines, each carrying the wall-clock time it was written, every
``--every`` seconds; the bench follows the job's logs with the code `job logs -f` runs (the
resumable jsonl stream of client/follow.py) and records arrival - written for each line.
Columns:

* local:    the embedded local backend (launcher on this machine, HTTP over loopback);
* machines: the same job on a `--backend machines` cluster whose node is a real
            `batchyard agent` process with its own work dir (the multi-host code path:
            join, heartbeat, ticket, launcher over the node channel; loopback network).
* hosts:    (``--hosts``, root) across hosts that share no disk: the server in one network
            namespace (tests/hostkit.py), the agent and the rank in another, the follower
            on the server host; HTTPS between them.
* bare:     the same script writing to a local file followed by the real `tail -F` (GNU
            tail: inotify, so a line shows the moment it is written), this process reading
            tail's output: what following a file costs without any channel.

The columns alternate: ``--rounds`` rounds, each running every column once, in an order that
rotates from round to round; each figure is over all rounds' lines, with the min/median/max
of the rounds' p50 and the load average after each round.

    python bench/log_latency.py [--lines 200] [--every 0.02] [--rounds 3] [--hosts]

Target (issue 37): p50 <= 10 ms and p99 <= 30 ms on the local and machines columns.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import isolated_server, load

PRINTER = ("import sys, time\n"
           "n, every = int(sys.argv[1]), float(sys.argv[2])\n"
           "for i in range(n):\n"
           "    print(f'LAT {i} {time.time():.6f}', flush=True)\n"
           "    time.sleep(every)\n")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def follow(client: object, name: str, want: int) -> list[float]:
    """What `job logs -f` runs (cli/job_logs.py): the resumable stream, format=jsonl."""
    from batchyard.client.follow import follow_logs
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    lags: list[float] = []
    buf = b""
    for chunk in follow_logs(client, client.job_path("default", "default", name),
                             prefix=False):
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
            tag: str, chain: dict[str, list[float]] | None = None) -> list[float]:
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    name = f"lat-{tag}"
    spec = {"nodes": 1, "distribution": {"type": "custom"},
            "command": [sys.executable, str(script), str(lines), str(every)]}
    watch = None
    if chain is not None:
        watch = threading.Thread(target=watch_copies, args=(name, lines, chain), daemon=True)
        watch.start()
    client.post("/workspaces/default/jobs", {"spec": spec, "cluster": cluster, "name": name})
    lags = follow(client, name, lines)
    if watch is not None:
        watch.join(timeout=30)
    return lags


NODE_ROOTS: list[Path] = []  # work dirs of agents (outside the server's home)


def watch_copies(name: str, lines: int, chain: dict[str, list[float]]) -> None:
    """``--chain``: `tail -F` of the rank's file on the node and of the server's copy, so
    each line's latency splits into node file -> server copy (the launcher's shipper, the
    POST, the append) and server copy -> follower (the server's wake-up of followers, the
    read, the stream)."""
    home = Path(os.environ["BATCHYARD_HOME"])
    found: dict[str, Path] = {}
    deadline = time.time() + 60
    while len(found) < 2 and time.time() < deadline:
        for root in (home, *NODE_ROOTS):
            for path in root.glob(f"**/jobs/{name}/*/stdouterr/*rank0.stdout.txt"):
                found["server copy" if str(path).startswith(str(home / "workspaces"))
                      else "node file"] = path
        time.sleep(0.005)
    started = time.time()
    threads = [threading.Thread(target=_tail_into, args=(path, lines, started,
                                                         chain.setdefault(kind, [])))
               for kind, path in found.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)


def _tail_into(path: Path, lines: int, after: float, out: list[float]) -> None:
    tail = subprocess.Popen(["tail", "-F", "-n", "+1", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert tail.stdout is not None
    try:
        seen = 0
        while seen < lines:
            line = tail.stdout.readline()
            stamp = time.time()
            if not line:
                return
            parts = line.split()
            if len(parts) >= 3 and parts[0] == b"LAT":
                seen += 1
                if float(parts[2]) > after + 0.05:  # written after the watch began
                    out.append(stamp - float(parts[2]))
    finally:
        tail.kill()
        tail.wait()


def bare(lines: int, every: float, script: Path) -> list[float]:
    """`tail -F` of the file the script writes (tail started first, as a follower is)."""
    folder = Path(tempfile.mkdtemp())
    out = folder / "out.txt"
    out.touch()
    tail = subprocess.Popen(["tail", "-F", "-n", "+1", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert tail.stdout is not None
    time.sleep(0.2)  # tail has opened the file and set its inotify watch
    with open(out, "ab") as fh:
        proc = subprocess.Popen([sys.executable, str(script), str(lines), str(every)],
                                stdout=fh)
    lags: list[float] = []
    try:
        while len(lags) < lines:
            line = tail.stdout.readline()
            stamp = time.time()
            if not line:
                break
            parts = line.split()
            if len(parts) >= 3 and parts[0] == b"LAT":
                lags.append(stamp - float(parts[2]))
    finally:
        tail.kill()
        tail.wait()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
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
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chain", action="store_true", help="split each line's latency: "
                        "node file -> server copy -> follower (tail -F of both files)")
    parser.add_argument("--hosts", action="store_true", help="add the across-hosts column "
                        "(root: network namespaces)")
    parser.add_argument("--kinds", default="bare,local,machines",
                        help="the columns to run (bare is the anchor of the ratios)")
    parser.add_argument("--follow", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--script", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.follow:
        follow_here(args.lines, args.every, args.script)
        return
    # a job runs as an unprivileged uid with a private /tmp: its script lies outside /tmp,
    # readable by all
    tmp = Path(tempfile.mkdtemp(prefix="bench-lat-", dir="/var/tmp"))
    tmp.chmod(0o755)
    script = tmp / "printer.py"
    script.write_text(PRINTER)
    script.chmod(0o644)
    kinds = [k for k in ("bare", "local", "machines") if k in args.kinds.split(",")]
    rounds: dict[str, list[list[float]]] = {k: [] for k in kinds}
    chains: dict[str, dict[str, list[float]]] = {"local": {}, "machines": {}}
    loads: list[str] = []
    with isolated_server():
        from batchyard.client.http import Client

        client = Client.connect(quiet=True)
        client.post("/workspaces/default/clusters", {"name": "local1",
                                                     "vm_size": "Standard_D2_v2",
                                                     "manual": {"target_node_count": 1}})
        agent = start_agent(client, tmp / "agent-work") if "machines" in kinds else None
        NODE_ROOTS.append(tmp / "agent-work")
        try:
            for r in range(args.rounds):
                for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                    if kind == "bare":
                        lags = bare(args.lines, args.every, script)
                    else:
                        cluster = "local1" if kind == "local" else "farm"
                        lags = through(client, cluster, args.lines, args.every, script,
                                       f"{kind}-{r}", chains[kind] if args.chain else None)
                    rounds[kind].append(lags)
                loads.append(load())
                print(f"  round {r + 1}: " + ", ".join(
                    f"{k} p50 {pct(v[-1], 0.5) * 1000:.1f} ms" for k, v in rounds.items())
                    + f"; load {loads[-1]}", flush=True)
        finally:
            if agent is not None:
                agent.terminate()
                threading.Timer(5, agent.kill).start()
                agent.wait()
        client.close()
    if args.hosts:
        rounds["hosts"] = [across_hosts(args.lines, args.every, script, tmp)]
    summary: dict[str, dict[str, object]] = {}
    print(f"write -> follower latency, {args.lines} lines every {args.every * 1000:.0f} ms, "
          f"{args.rounds} alternated rounds (p50/p99 over all lines; min/median/max of the "
          "rounds' p50):")
    for kind, per_round in rounds.items():
        lags = [x for r in per_round for x in r]
        p50, p99 = pct(lags, 0.5) * 1000, pct(lags, 0.99) * 1000
        r50 = [pct(r, 0.5) * 1000 for r in per_round if r]
        r99 = [pct(r, 0.99) * 1000 for r in per_round if r]
        summary[kind] = {"p50_ms": round(p50, 1), "p99_ms": round(p99, 1), "n": len(lags),
                         "round_p50_ms": [round(min(r50), 1), round(statistics.median(r50), 1),
                                          round(max(r50), 1)],
                         "round_p99_ms": [round(min(r99), 1), round(statistics.median(r99), 1),
                                          round(max(r99), 1)]}
        print(f"  {kind:9s} p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   rounds' p50 "
              f"{min(r50):.1f}/{statistics.median(r50):.1f}/{max(r50):.1f} ms, p99 "
              f"{min(r99):.1f}/{statistics.median(r99):.1f}/{max(r99):.1f} ms")
    for kind in [k for k in ("local", "machines", "hosts") if k in summary]:
        for q in ("p50_ms", "p99_ms"):
            if "bare" not in summary:
                continue
            ratio = float(summary[kind][q]) / max(float(summary["bare"][q]), 0.1)  # type: ignore[arg-type]
            summary[kind][f"{q[:3]}_ratio_vs_bare"] = round(ratio, 1)
        if "bare" not in summary:
            continue
        over = [float(summary[kind][q]) - float(summary["bare"][q])  # type: ignore[arg-type]
                for q in ("p50_ms", "p99_ms")]
        print(f"  {kind:9s} / tail -F: p50 x{summary[kind]['p50_ratio_vs_bare']}, "
              f"p99 x{summary[kind]['p99_ratio_vs_bare']} (+{over[0]:.1f} / +{over[1]:.1f} ms)")
    for kind, chain in chains.items():
        if chain:
            print(f"  {kind}: write -> " + ", ".join(
                f"{where} p50 {pct(v, 0.5) * 1000:.1f} / p99 {pct(v, 0.99) * 1000:.1f} ms"
                for where, v in sorted(chain.items(), key=lambda kv: pct(kv[1], 0.5)) if v)
                + f", follower p50 {summary[kind]['p50_ms']} / p99 {summary[kind]['p99_ms']} ms")
    print(f"  target: p50 <= 10 ms, p99 <= 30 ms on local and machines; load {loads}")
    print(json.dumps({"kinds": summary, "load": loads}))


if __name__ == "__main__":
    main()
