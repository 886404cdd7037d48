"""A fleet of N machines against one real server, by simulation.

N simulated `batchyard agent`s (bench/_fleet_agent.py: many per process on one event loop,
``--procs`` processes, speaking the real agent and node-channel protocol over HTTP, one
connection per call as the real ones) join a ``--backend machines`` cluster of a real server
(started as bench/_harness.py starts one), then:

1. **idle** (``--idle`` s): every agent heartbeats (the real long poll);
2. **busy** (``--job-seconds`` s of warm-up, then ``--busy-seconds`` s measured): jobs of
   ``--job-nodes`` x ``--ppn`` ranks running ``sleep --job-seconds`` are submitted at the rate
   that keeps ``--busy`` of the fleet running (Little's law); each node's simulated launcher
   fetches its plan, meets its gang, reports its states (and a usage sample every 2 s),
   long-polls its control, ships each rank's ``--lines`` log lines a second with the real
   shipper's rhythm, posts each rank's metrics every second, and ends ``succeeded``;
   ``--followers`` clients follow jobs' logs (`job logs -f`) meanwhile.

Measured per phase, with the load average: heartbeat latency (round trip beyond the long
poll's hold: p50/p99/max) and the longest silence of any agent, nodes the server declared
``lost`` (every agent keeps beating: each one is false), submit latency p50/p99, scheduling
latency (submit -> every node of the gang told to run it) and submit -> all ranks running,
write -> `job logs -f` latency, the node channel's calls (rate, p99), errors, and the CPU and
RSS of the server processes (and of PostgreSQL, which shares the machine) per agent.

    python bench/fleet_sim.py --agents 100,300,1000 [--db sqlite,postgresql] [--workers 2]
                              [--profile 1000]

``--db postgresql`` starts a private PostgreSQL (tests/pgkit.py; root runs it as
``postgres``), a fresh database per run, with ``--workers`` server processes. ``--profile N``
records the server with py-spy during the busy phase at N agents and prints where its time
goes (bench/_pyspy.py). Target (issue 37): 1,000 agents on a 2-core machine, PostgreSQL with
2 workers: 0 false ``lost``, heartbeat p99 < 1 s, submit p99 < 200 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fleet_report import Window, print_table, summarize
from _harness import ROOT, isolated_server, load

AGENT = Path(__file__).resolve().parent / "_fleet_agent.py"
API = "/api/v1"


@contextlib.contextmanager
def database(kind: str) -> Iterator[Any]:
    """None for SQLite; for PostgreSQL a private server whose ``create_database`` gives each
    run an empty database."""
    if kind == "sqlite":
        yield None
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from pgkit import Postgres

    pg = Postgres()
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


class Sampler(threading.Thread):
    """CPU seconds and RSS of the server's processes (and PostgreSQL's) once a second."""

    def __init__(self, server_pid: int, pg_pid: int | None) -> None:
        super().__init__(daemon=True)
        self.server_pid, self.pg_pid = server_pid, pg_pid
        self.samples: list[tuple[float, float, float, float]] = []  # t, server cpu, rss, pg
        self.stop = threading.Event()

    @staticmethod
    def _tree(pid: int, only_server: bool) -> list[Any]:
        import psutil

        try:
            root = psutil.Process(pid)
            kids = root.children(recursive=True)
        except psutil.Error:
            return []
        if only_server:  # the server and its workers, not the launchers it may fork
            kids = [k for k in kids if _cmd(k)[1:3] == ["-m", "batchyard.server"]]
        return [root, *kids]

    def one(self) -> tuple[float, float, float, float]:
        import psutil

        cpu = rss = pg = 0.0
        for proc in self._tree(self.server_pid, True):
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                cpu += t.user + t.system
                rss += proc.memory_info().rss
        if self.pg_pid:
            for proc in self._tree(self.pg_pid, False):
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    pg += t.user + t.system + t.children_user + t.children_system
        return time.time(), cpu, rss, pg

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.one())
            self.stop.wait(1.0)


def _cmd(proc: Any) -> list[str]:
    try:
        return list(proc.cmdline())
    except Exception:
        return []


def _client() -> tuple[str, dict[str, str]]:
    from batchyard.config import read_server_info, read_token

    info = read_server_info()
    assert info is not None
    return info.url, {"Authorization": f"Bearer {read_token()}"}


def node_states(http: Any) -> dict[str, int]:
    resp = http.get("/workspaces/default/clusters/fleet", timeout=120)
    resp.raise_for_status()
    out: dict[str, int] = {}
    for node in resp.json().get("nodes") or []:
        out[node["state"]] = out.get(node["state"], 0) + 1
    return out


def job_states(http: Any) -> dict[str, int]:
    resp = http.get("/workspaces/default/jobs", params={"experiment": "fleet"}, timeout=300)
    if resp.status_code == 404:  # no job was submitted (no busy phase)
        return {}
    resp.raise_for_status()
    out: dict[str, int] = {}
    for job in resp.json():
        out[job["state"]] = out.get(job["state"], 0) + 1
    return out


# --- the busy phase's clients -----------------------------------------------------------------

async def submitter(url: str, headers: dict[str, str], rate: float, until: float,
                    spec: dict[str, Any], submits: list[tuple[float, float, str, int]],
                    to_follow: list[str]) -> None:
    import aiohttp

    i = 0
    started = time.time()
    async with aiohttp.ClientSession(headers=headers) as http:
        pending: set[asyncio.Task[None]] = set()

        async def one(name: str) -> None:
            t0 = time.time()
            try:
                async with http.post(f"{url}{API}/workspaces/default/jobs", json={
                        "spec": spec, "cluster": "fleet", "experiment": "fleet",
                        "name": name}, timeout=aiohttp.ClientTimeout(total=60)) as resp:
                    await resp.read()
                    status = resp.status
            except (asyncio.TimeoutError, aiohttp.ClientError):
                status = 599
            submits.append((t0, time.time() - t0, name, status))
            if status == 201:
                to_follow.append(name)

        while time.time() < until:
            due = started + i / rate
            if due > time.time():
                await asyncio.sleep(due - time.time())
            task = asyncio.create_task(one(f"f{i}"))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
        await asyncio.gather(*pending)


def follower(url: str, headers: dict[str, str], names: list[str], until: float,
             lags: list[tuple[float, float]]) -> None:
    """`job logs -f` of one submitted job after another, each line's arrival - its stamp."""
    import httpx

    with httpx.Client(base_url=url + API, headers=headers, timeout=None) as http:
        while time.time() < until:
            if not names:
                time.sleep(0.2)
                continue
            name = names.pop()
            buf = b""
            try:
                with http.stream("GET", f"/workspaces/default/experiments/fleet/jobs/{name}/logs",
                                 params={"follow": "true", "prefix": "false"}) as resp:
                    for chunk in resp.iter_bytes():
                        buf += chunk
                        *lines, buf = buf.split(b"\n")
                        stamp = time.time()
                        for line in lines:
                            parts = line.split()
                            if len(parts) >= 3 and parts[0] == b"FLEET":
                                lags.append((stamp, stamp - float(parts[2])))
                        if time.time() > until:
                            break
            except httpx.HTTPError:
                time.sleep(0.5)


# --- one run ----------------------------------------------------------------------------------

def run_one(n: int, db: str, pg: Any, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    if pg is not None:
        os.environ["BATCHYARD_DB_URL"] = pg.create_database()
        os.environ["BATCHYARD_WORKERS"] = str(args.workers)
    out: dict[str, Any] = {"agents": n, "db": db, "workers": args.workers if pg else 1,
                           "load_start": load()}
    try:
        with isolated_server() as home:
            url, headers = _client()
            http = httpx.Client(base_url=url + API, headers=headers, timeout=60)
            http.post("/workspaces/default/clusters", json={
                "name": "fleet", "backend": "machines", "vm_size": "Standard_D2_v2",
                "manual": {"target_node_count": 0}}).raise_for_status()
            token = http.post("/workspaces/default/clusters/fleet/join-tokens",
                              json={"ttl": 24 * 3600}).json()
            from batchyard.config import read_server_info

            info = read_server_info()
            assert info is not None and info.pid is not None
            pg_pid = pg.proc.pid if pg is not None and pg.proc is not None else None
            sampler = Sampler(info.pid, pg_pid)
            sampler.start()
            time.sleep(3.0)
            out["idle_empty"] = (time.time() - 3.0, time.time())
            procs = start_agents(n, token, args)
            t0 = time.time()
            try:
                out["join_s"] = wait_joined(http, n, t0 + args.ramp_for(n) + 180)
                time.sleep(3.0)  # the last joins' first heartbeats
                idle_from = time.time()
                if n in args.profile:
                    from _pyspy import record

                    out["profile_idle"] = record(out_pids(), args.idle * 0.8)
                time.sleep(max(0.0, idle_from + args.idle - time.time()))
                out["idle"] = (idle_from, time.time())
                out["load_idle"] = load()
                if args.busy_seconds > 0:
                    busy(n, url, headers, args, out)
                out["load_busy"] = load()
                for key, look in (("nodes_end", node_states), ("jobs_end", job_states)):
                    try:
                        out[key] = look(http)
                    except httpx.HTTPError as exc:  # a server that collapsed: say so
                        out[key] = {"unanswered": repr(exc)[:80]}
            finally:
                out["agents_out"] = stop_agents(procs)
                sampler.stop.set()
                sampler.join()
            out["samples"] = sampler.samples
            out["home"] = str(home)
            http.close()
    finally:
        os.environ.pop("BATCHYARD_DB_URL", None)
        os.environ.pop("BATCHYARD_WORKERS", None)
    return out


def start_agents(n: int, token: dict[str, Any], args: argparse.Namespace) -> list[Any]:
    procs = []
    per = -(-n // args.procs)
    for p in range(args.procs):
        first, count = p * per, min(per, n - p * per)
        if count <= 0:
            break
        argv = [sys.executable, str(AGENT), "--server", token["server"], "--join-token",
                token["token"], "--first", str(first), "--count", str(count), "--lines",
                str(args.lines), "--ramp", str(args.ramp_for(n))]
        if args.keepalive:
            argv.append("--keepalive")
        procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=open(Path(tempfile.gettempdir()) /  # noqa: SIM115
                                                  f"fleet-agent-{p}.log", "w")))
    return procs


def wait_joined(http: Any, n: int, deadline: float) -> float:
    import httpx

    t0 = time.time()
    while time.time() < deadline:
        try:
            states = node_states(http)
        except httpx.HTTPError:
            continue  # a server slow to answer while a fleet joins
        if sum(states.values()) >= n:
            return time.time() - t0
        time.sleep(2.0)
    raise RuntimeError(f"only {sum(node_states(http).values())} of {n} agents joined")


def stop_agents(procs: list[Any]) -> list[dict[str, Any]]:
    outs = []
    for proc in procs:
        proc.stdin.close()
    for proc in procs:
        data = proc.stdout.read()
        proc.wait(timeout=300)
        lines = data.decode().strip().splitlines()
        outs.append(json.loads(lines[-1]) if lines else {})
    return outs


def busy(n: int, url: str, headers: dict[str, str], args: argparse.Namespace,
         out: dict[str, Any]) -> None:
    spec = {"nodes": args.job_nodes, "command": f"sleep {args.job_seconds:g}",
            "distribution": {"type": "pytorch", "processes_per_node": args.ppn}}
    rate = args.busy * n / args.job_nodes / args.job_seconds
    start = time.time()
    until = start + args.job_seconds + args.busy_seconds
    submits: list[tuple[float, float, str, int]] = []
    to_follow: list[str] = []
    lags: list[tuple[float, float]] = []
    threads = [threading.Thread(target=follower, args=(url, headers, to_follow, until, lags),
                                daemon=True) for _ in range(args.followers)]
    for t in threads:
        t.start()
    spy = None
    if args.profile and n in args.profile:
        from _pyspy import record

        spy = threading.Thread(target=lambda: out.update(profile=record(
            out_pids(), args.busy_seconds * 0.6, delay=args.job_seconds + 5)), daemon=True)
        spy.start()
    asyncio.run(submitter(url, headers, rate, until, spec, submits, to_follow))
    for t in threads:
        t.join(timeout=30)
    if spy is not None:
        spy.join(timeout=args.busy_seconds + 120)
    out.update(busy=(start + args.job_seconds, until), submits=submits, log_lags=lags,
               rate=rate)


def out_pids() -> list[int]:
    from batchyard.config import read_server_info

    info = read_server_info()
    assert info is not None and info.pid is not None
    return [p.pid for p in Sampler._tree(info.pid, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    parser.add_argument("--agents", type=ints, default=[100, 300, 1000])
    parser.add_argument("--db", default="sqlite", help="sqlite, postgresql, or both (a,b)")
    parser.add_argument("--workers", type=int, default=2, help="server processes on PostgreSQL")
    parser.add_argument("--procs", type=int, default=2, help="processes of simulated agents")
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--busy", type=float, default=0.5, help="share of the fleet running")
    parser.add_argument("--busy-seconds", type=float, default=60.0)
    parser.add_argument("--job-nodes", type=int, default=4)
    parser.add_argument("--ppn", type=int, default=2)
    parser.add_argument("--job-seconds", type=float, default=30.0)
    parser.add_argument("--lines", type=float, default=10.0, help="log lines/s per rank")
    parser.add_argument("--followers", type=int, default=4)
    parser.add_argument("--keepalive", action="store_true",
                        help="agents reuse connections (the real ones open one per call)")
    parser.add_argument("--profile", type=ints, default=[],
                        help="py-spy the server in the busy phase at these N")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    args.ramp_for = lambda n: max(5.0, n / 50)
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows = []
    for db in args.db.split(","):
        with database(db) as pg:
            for n in args.agents:
                raw = run_one(n, db, pg, args)
                row = summarize(raw, Window)
                rows.append(row)
                print_table([row], header=len(rows) == 1)
                for phase in ("profile_idle", "profile"):
                    if phase in raw:
                        print(f"py-spy of the server, {phase.replace('profile_', '')} "
                              f"phase, {n} agents:\n{raw[phase]}")
                sys.stdout.flush()
    print()
    print_table(rows, header=True)
    print(json.dumps(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
