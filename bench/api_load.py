"""The API under team-scale load: a real server in a temp home, many concurrent clients.

Measured in one run, against ``/health`` of the same server as the baseline (the cheapest
authenticated call: the floor of what the server can do per request):

* ``/health`` rate with 10 concurrent clients (the baseline), and sequentially on one reused
  connection (what every CLI call and SDK loop does);
* single job GET p50 on one reused connection;
* submits/s, p50 to max at 16 / 100 / 1,000 concurrent clients (aiohttp, one connection
  each); errors counted: any 5xx, timeouts and broken connections, and duplicates or losses
  (jobs created in the database vs 2xx answers);
* ``/health`` p50/p99 while N ``job logs -f`` followers of quiet (queued) jobs are attached;
* with ``--queued N``: on a second server, N queued jobs pre-filled straight through the
  store, then submit rate and first-page list latency (``GET .../jobs?limit=100``, and
  ``batchyard job list`` end to end) with that queue;
* submits/s with a user's personal token (a contributor of the workspace) against the
  admin token (the home's), in alternating rounds on the same server: the cost of
  authorising a user (issue 32: the ratio must be at least 0.95). ``--tokens-only`` runs
  just that.

* with ``--slurm`` (root): the anchor, submits/s of `sbatch` on a real Slurm started here
  (bench/_slurm_anchor.py; jobs held, so they stay pending) from 16 parallel processes,
  against batchyard's submits from 16 clients, in alternated rounds (min/median/max).

Every job goes to a cluster whose one node takes an hour to provision, so jobs stay queued
(nothing runs; the bench measures the API, not launches).

    python bench/api_load.py [--clients 10,100,1000] [--followers 45,200,1000]
                             [--queued 100000] [--db postgresql://...] [--workers 2]
                             [--slurm] [--token-rounds 5] [--tokens-only]

``--db`` runs everything again on that database (an empty one: the names are fixed; skipped
when not given), with ``--workers`` server processes (``batchyard server start --workers``;
server CPU figures then sum them). Followers come last on the first server: a server that
holds a thread per follower may not recover from them; the big queue gets a server of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import isolated_server, load
from _token_ratio import personal_token, report_tokens, token_rounds

API = "/api/v1"
CLUSTER = "q"
JOB_SPEC = {"nodes": 1, "distribution": {"type": "custom"}, "command": "true"}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(value: float) -> str:
    return "-" if value != value else f"{value * 1000:.1f}"  # nan


def _auth() -> tuple[str, dict[str, str]]:
    from batchyard.config import read_server_info, read_token

    info = read_server_info()
    assert info is not None
    return info.url, {"Authorization": f"Bearer {read_token()}"}


# --- set-up -----------------------------------------------------------------------------------


def setup(http: Any) -> None:
    """A cluster of one node that stays `preparing` for an hour: jobs fit, and stay queued."""
    resp = http.post("/workspaces/default/clusters", json={
        "name": CLUSTER, "vm_size": "Standard_D2_v2", "manual": {"target_node_count": 1},
        "provisioning_delay": 3600})
    assert resp.status_code in (201, 409), resp.text  # 409: a --db run's second server


def count_jobs(http: Any, experiment: str) -> int:
    resp = http.get("/workspaces/default/jobs", params={"experiment": experiment},
                    timeout=600)
    resp.raise_for_status()
    total = len(resp.json())
    cursor = resp.headers.get("x-next-cursor")
    while cursor:  # a paging server without ?limit answers everything anyway; be safe
        resp = http.get("/workspaces/default/jobs", params={"experiment": experiment,
                                                            "cursor": cursor}, timeout=600)
        total += len(resp.json())
        cursor = resp.headers.get("x-next-cursor")
    return total


# --- sequential probes ------------------------------------------------------------------------


def sequential(http: Any, path: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        resp = http.get(path)
        out.append(time.perf_counter() - t0)
        assert resp.status_code == 200, resp.text
    return out


async def health_rate(url: str, headers: dict[str, str], clients: int, seconds: float) -> float:
    import httpx

    done = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url + API, headers=headers, limits=limits,
                                 timeout=30) as http:

        async def one() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                resp = await http.get("/health")
                if resp.status_code == 200:
                    done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        took = time.perf_counter() - t0
    return done / took


# --- submits ----------------------------------------------------------------------------------


async def submits(url: str, headers: dict[str, str], clients: int, total: int,
                  experiment: str, timeout: float = 30.0) -> dict[str, Any]:
    """``total`` submits from ``clients`` concurrent clients, one keep-alive connection each.

    The clients are aiohttp's: httpx's async client spent ~1.8 ms of CPU per request here,
    which at 500 submits/s is most of one of this machine's two cores taken from the server
    it measures (``BENCH_CLIENT=httpx`` brings it back, to compare)."""
    lat: list[float] = []
    errors = {"5xx": 0, "4xx": 0, "timeout": 0, "broken": 0}
    messages: dict[str, int] = {}
    next_index = 0
    post = await _poster(url + API, headers, clients, timeout)

    async def client() -> None:
        nonlocal next_index
        while next_index < total:
            i = next_index
            next_index += 1
            body = {"spec": JOB_SPEC, "cluster": CLUSTER, "experiment": experiment,
                    "name": f"{experiment}-{i}"}
            t0 = time.perf_counter()
            try:
                status, text = await post.send("/workspaces/default/jobs", body)
            except asyncio.TimeoutError:
                errors["timeout"] += 1
                continue
            except OSError as exc:  # aiohttp's and httpx's connection errors
                errors["broken"] += 1
                messages[repr(exc)[:120]] = messages.get(repr(exc)[:120], 0) + 1
                continue
            if status >= 500:
                errors["5xx"] += 1
                messages[text[:120]] = messages.get(text[:120], 0) + 1
            elif status >= 400:
                errors["4xx"] += 1
                messages[text[:120]] = messages.get(text[:120], 0) + 1
            else:
                lat.append(time.perf_counter() - t0)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        took = time.perf_counter() - t0
    finally:
        await post.close()
    return {"clients": clients, "total": total, "ok": len(lat), "rate": len(lat) / took,
            "p50": pct(lat, 0.5), "p90": pct(lat, 0.9), "p99": pct(lat, 0.99),
            "max": max(lat, default=float("nan")), "errors": errors,
            "messages": messages, "seconds": took, "client": post.name}


class _Poster:
    name = ""

    async def send(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


async def _poster(base: str, headers: dict[str, str], clients: int,
                  timeout: float) -> _Poster:
    if os.environ.get("BENCH_CLIENT", "aiohttp") == "httpx":
        return _HttpxPoster(base, headers, clients, timeout)
    return _AiohttpPoster(base, headers, clients, timeout)


class _AiohttpPoster(_Poster):
    name = "aiohttp"

    def __init__(self, base: str, headers: dict[str, str], clients: int,
                 timeout: float) -> None:
        import aiohttp

        self.base = base
        self.http = aiohttp.ClientSession(
            headers=headers, connector=aiohttp.TCPConnector(limit=clients),
            timeout=aiohttp.ClientTimeout(total=timeout))

    async def send(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        import aiohttp

        try:
            async with self.http.post(self.base + path, json=body) as resp:
                # read whole, always: a body left unread closes the connection (aiohttp),
                # and the clients reconnected every ~6 submits, which no real client does
                text = await resp.text()
                return resp.status, text if resp.status >= 400 else ""
        except aiohttp.ClientError as exc:
            raise OSError(str(exc)) from exc

    async def close(self) -> None:
        await self.http.close()


class _HttpxPoster(_Poster):
    name = "httpx"

    def __init__(self, base: str, headers: dict[str, str], clients: int,
                 timeout: float) -> None:
        import httpx

        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        self.http = httpx.AsyncClient(base_url=base, headers=headers, limits=limits,
                                      timeout=timeout)

    async def send(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        import httpx

        try:
            resp = await self.http.post(path, json=body)
        except httpx.TimeoutException:
            raise asyncio.TimeoutError from None
        except httpx.HTTPError as exc:
            raise OSError(str(exc)) from exc
        return resp.status_code, resp.text if resp.status_code >= 400 else ""

    async def close(self) -> None:
        await self.http.aclose()


# --- log followers ----------------------------------------------------------------------------


async def with_followers(url: str, headers: dict[str, str], jobs: list[tuple[str, str]],
                         count: int, probes: int = 100) -> dict[str, Any]:
    """Attach ``count`` `job logs -f` followers (cycling over ``jobs``), then time /health."""
    import httpx

    attached = 0
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
    fol = httpx.AsyncClient(base_url=url + API, headers=headers, limits=limits,
                            timeout=httpx.Timeout(30, read=None))

    async def follower(exp: str, name: str) -> None:
        nonlocal attached
        path = f"/workspaces/default/experiments/{exp}/jobs/{name}/logs"
        try:
            async with fol.stream("GET", path, params={"follow": "true"}) as resp:
                attached += 1
                async for _chunk in resp.aiter_bytes():
                    if stop.is_set():
                        break
        except (httpx.HTTPError, asyncio.CancelledError):
            pass

    tasks = [asyncio.create_task(follower(*jobs[i % len(jobs)])) for i in range(count)]
    deadline = time.perf_counter() + 30
    while attached < count and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # let them settle into their waits
    lat: list[float] = []
    timeouts = 0
    async with httpx.AsyncClient(base_url=url + API, headers=headers, timeout=2.0) as http:
        budget = time.perf_counter() + 30
        for _ in range(probes):
            if time.perf_counter() > budget:
                break
            t0 = time.perf_counter()
            try:
                resp = await http.get("/health")
                if resp.status_code == 200:
                    lat.append(time.perf_counter() - t0)
            except httpx.HTTPError:
                timeouts += 1
            await asyncio.sleep(0.01)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await fol.aclose()
    return {"followers": count, "attached": attached, "p50": pct(lat, 0.5),
            "p99": pct(lat, 0.99), "timeouts": timeouts, "answered": len(lat)}


# --- a big queue ------------------------------------------------------------------------------


def prefill(db_url: str, count: int, experiment: str) -> float:
    """``count`` queued jobs inserted straight through the store (one multi-row INSERT per
    5,000), on the bench's cluster, as submit would have stored them."""
    from sqlalchemy import insert, select

    from batchyard.server.services.jobs import job_dir
    from batchyard.store.db import Database
    from batchyard.store.models import Cluster, Experiment, Job, Workspace

    db = Database(db_url)
    t0 = time.perf_counter()
    with db.session() as s:
        ws = s.scalar(select(Workspace).where(Workspace.name == "default"))
        assert ws is not None
        exp = s.scalar(select(Experiment).where(Experiment.workspace_id == ws.id,
                                                Experiment.name == experiment))
        if exp is None:
            exp = Experiment(workspace_id=ws.id, name=experiment)
            s.add(exp)
            s.flush()
        cluster = s.scalar(select(Cluster).where(Cluster.name == CLUSTER))
        assert cluster is not None
        template = s.scalar(select(Job.spec).where(Job.cluster_id == cluster.id).limit(1))
        assert template is not None, "submit one job first: its stored spec is the template"
        ids = (ws.id, exp.id, cluster.id)
    batch = 5000
    stamp = time.time()
    for start in range(0, count, batch):
        rows = []
        for i in range(start, min(count, start + batch)):
            name = f"{experiment}-{i}"
            rows.append({"workspace_id": ids[0], "experiment_id": ids[1], "cluster_id": ids[2],
                         "name": name, "spec": {**template, "name": name,
                                                "experiment": experiment},
                         "source_format": "native", "state": "queued",
                         "pending_reason": "waiting for the scheduler", "priority": 1,
                         "attempt": 0, "cancel_requested": False, "submitted_at": stamp,
                         "directory": str(job_dir("default", experiment, name))})
        with db.session() as s:
            s.execute(insert(Job), rows)
    db.engine.dispose()
    return time.perf_counter() - t0


def server_cpu(seconds: float = 10.0, settle: float = 120.0) -> tuple[float, float]:
    """(share of one core the idle server used over ``seconds``, seconds it took to settle):
    first waited for until three seconds in a row each use under a quarter of a core. One
    quiet second was not enough: an idle reconciler passes once a second, and the pass that
    first reads a prefilled queue may come after it (it then landed in the measurement:
    11 % instead of 4.5 %)."""
    import psutil

    from batchyard.config import read_server_info

    info = read_server_info()
    assert info is not None
    procs = server_processes(info.pid)

    def used() -> float:
        total = 0.0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                total += sum(proc.cpu_times()[:2])
        return total

    start = time.monotonic()
    quiet = 0
    while time.monotonic() - start < settle and quiet < 3:
        before = used()
        time.sleep(1.0)
        quiet = quiet + 1 if used() - before < 0.25 else 0
    settled = time.monotonic() - start
    before = used()
    time.sleep(seconds)
    return (used() - before) / seconds, settled


def server_seconds() -> float:
    """CPU seconds the server (all its processes) has used so far."""
    from batchyard.config import read_server_info

    info = read_server_info()
    assert info is not None and info.pid is not None
    return sum(sum(p.cpu_times()[:2]) for p in server_processes(info.pid))


def server_processes(pid: int) -> list[Any]:
    """The server and its workers (``--workers``), not the launchers it forks."""
    import psutil

    main = psutil.Process(pid)
    found = [main]
    for child in main.children():
        with contextlib.suppress(psutil.Error):
            if child.cmdline()[1:3] == ["-m", "batchyard.server"]:
                found.append(child)
    return found


def list_latency(http: Any, budget: float = 60.0) -> tuple[float, int, int]:
    """Median time of the first page (``?limit=100``), the rows it returned, and runs."""
    times: list[float] = []
    rows = 0
    end = time.perf_counter() + budget
    for _ in range(20):
        t0 = time.perf_counter()
        resp = http.get("/workspaces/default/jobs", params={"limit": 100}, timeout=600)
        times.append(time.perf_counter() - t0)
        resp.raise_for_status()
        rows = len(resp.json())
        if time.perf_counter() > end:
            break
    return statistics.median(times), rows, len(times)


def cli_job_list(runs: int = 5, budget: float = 120.0) -> tuple[float, str]:
    """Median wall time of `batchyard job list` (the installed script) and how it went."""
    script = Path(sys.executable).with_name("batchyard")
    argv = [str(script)] if script.is_file() else [shutil.which("batchyard") or "batchyard"]
    times = []
    end = time.perf_counter() + budget
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run([*argv, "job", "list"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=os.environ, timeout=600)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            return times[-1], f"FAILED rc {proc.returncode}: {proc.stderr.strip()[-160:]}"
        if time.perf_counter() > end:
            break
    return statistics.median(times), f"median of {len(times)}"


def warm_up(url: str, headers: dict[str, str], clients: int) -> None:
    """200 submits not counted: a fresh server opens its pooled connections and compiles
    its statements on its first requests, which the first level would pay alone."""
    asyncio.run(submits(url, headers, clients, 200, f"warmup{time.monotonic_ns()}"))


def sbatch_anchor(url: str, headers: dict[str, str], total: int, rounds: int = 3,
                  parallel: int = 16) -> dict[str, Any]:
    """Alternated rounds of ``total`` submits: batchyard from ``parallel`` clients, `sbatch`
    from ``parallel`` processes on a real Slurm (held jobs)."""
    from _slurm_anchor import slurm

    rates: dict[str, list[float]] = {"batchyard": [], "sbatch": []}
    with slurm() as anchor:
        for r in range(rounds):
            for kind in ("batchyard", "sbatch") if r % 2 == 0 else ("sbatch", "batchyard"):
                if kind == "sbatch":
                    rates[kind].append(anchor.submits(parallel, total)["rate"])
                else:
                    rates[kind].append(asyncio.run(submits(url, headers, parallel, total,
                                                           f"anchor{r}"))["rate"])
    return {"parallel": parallel, "total": total, "rates": rates, "load": load()}


# --- one run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, label: str) -> dict[str, Any]:
    import httpx

    from batchyard.config import database_url

    out: dict[str, Any] = {"db": label, "load_start": load()}
    with isolated_server():
        url, headers = _auth()
        http = httpx.Client(base_url=url + API, headers=headers, timeout=60)
        setup(http)
        if args.token_rounds:
            personal = personal_token(http)
            warm_up(url, headers, args.clients[0])
            warm_up(url, personal, args.clients[0])
            out["tokens"] = token_rounds(submits, url, headers, personal, args.clients[0],
                                         max(args.min_jobs // 2, args.clients[0]),
                                         args.token_rounds, server_seconds)
            if args.tokens_only:
                http.close()
                return out
        out["idle_cpu"], _ = server_cpu()
        out["health_seq"] = sequential(http, "/health", 300)
        out["health_rate"] = asyncio.run(health_rate(url, headers, 10, 3.0))
        resp = http.post("/workspaces/default/jobs", json={
            "spec": JOB_SPEC, "cluster": CLUSTER, "experiment": "probe", "name": "probe"})
        assert resp.status_code == 201, resp.text
        out["get_seq"] = sequential(http, "/workspaces/default/experiments/probe/jobs/probe",
                                    200)
        warm_up(url, headers, args.clients[0])
        out["submits"] = []
        jobs: list[tuple[str, str]] = [("probe", "probe")]
        for clients in args.clients:
            exp = f"load{clients}"
            total = max(args.min_jobs, clients)
            result = asyncio.run(submits(url, headers, clients, total, exp))
            created = count_jobs(http, exp)
            result["created"] = created
            result["dup_or_lost"] = created - result["ok"]
            out["submits"].append(result)
            jobs += [(exp, f"{exp}-{i}") for i in range(min(total, 1000))]
        if getattr(args, "slurm", False):
            out["anchor"] = sbatch_anchor(url, headers, min(args.min_jobs, 500))
        http.close()
        out["followers"] = []
        for count in args.followers:
            out["followers"].append(asyncio.run(with_followers(url, headers, jobs, count)))
            time.sleep(1.0)
    if args.queued:  # a server of its own: the one above may be jammed by its followers
        with isolated_server():
            url, headers = _auth()
            http = httpx.Client(base_url=url + API, headers=headers, timeout=60)
            setup(http)
            resp = http.post("/workspaces/default/jobs", json={
                "spec": JOB_SPEC, "cluster": CLUSTER, "experiment": "probe", "name": "probe2"})
            assert resp.status_code == 201, resp.text
            out["prefill_s"] = prefill(database_url(), args.queued, "big")
            out["queued_idle_cpu"], out["queued_settle_s"] = server_cpu()
            first = args.clients[0]
            warm_up(url, headers, first)
            result = asyncio.run(submits(url, headers, first, max(args.min_jobs, first),
                                         "afterbig"))
            result["created"] = count_jobs(http, "afterbig")
            result["dup_or_lost"] = result["created"] - result["ok"]
            out["queued_submit"] = result
            out["list_first_page"], out["list_rows"], out["list_runs"] = list_latency(http)
            out["cli_job_list"], out["cli_note"] = cli_job_list()
            http.close()
    return out


def report(out: dict[str, Any]) -> None:
    if "health_rate" not in out:  # --tokens-only
        print(f"\n== {out['db']} ==")
        report_tokens(out["tokens"])
        return
    base = out["health_rate"]
    seq = out["health_seq"]
    print(f"\n== {out['db']} == (load {out.get('load_start')} at start, {load()} now)")
    print(f"{'measure':<44}{'value':>14}{'ratio to /health':>20}")
    print(f"{'/health rate, 10 clients (baseline)':<44}{base:>11.0f}/s{1.0:>19.2f}x")
    seq_rate = len(seq) / sum(seq)
    print(f"{'/health rate, 1 reused connection':<44}{seq_rate:>11.0f}/s"
          f"{seq_rate / base:>19.2f}x")
    print(f"{'/health p50, 1 reused connection':<44}{ms(pct(seq, 0.5)):>11} ms")
    print(f"{'idle server CPU, empty queue':<44}{out['idle_cpu']:>12.1%}")
    g = out["get_seq"]
    print(f"{'job GET p50, 1 reused connection':<44}{ms(pct(g, 0.5)):>11} ms"
          f"{pct(seq, 0.5) / pct(g, 0.5):>19.2f}x")
    for r in out["submits"]:
        errs = sum(r["errors"].values())
        print(f"{'submit, ' + str(r['clients']) + ' clients':<44}{r['rate']:>11.0f}/s"
              f"{r['rate'] / base:>19.2f}x   p50 {ms(r['p50'])} ms  p90 {ms(r['p90'])} ms  "
              f"p99 {ms(r['p99'])} ms  max {ms(r['max'])} ms  "
              f"errors {errs} {r['errors']}  created-2xx {r['dup_or_lost']}")
        for text, n in list(r["messages"].items())[:3]:
            print(f"{'':<8}{n} x {text}")
    if "anchor" in out:
        a = out["anchor"]
        b, sb = a["rates"]["batchyard"], a["rates"]["sbatch"]
        print(f"{'submits/s, ' + str(a['parallel']) + ' at once, vs sbatch':<44}"
              f"batchyard {min(b):.0f}/{statistics.median(b):.0f}/{max(b):.0f}, sbatch "
              f"{min(sb):.0f}/{statistics.median(sb):.0f}/{max(sb):.0f} (min/median/max), "
              f"ratio {statistics.median(b) / statistics.median(sb):.2f}x; load {a['load']}")
    if "queued_submit" in out:
        r = out["queued_submit"]
        print(f"{'prefill (store inserts)':<44}{out['prefill_s']:>12.1f} s")
        print(f"{'idle server CPU with the queue':<44}{out['queued_idle_cpu']:>12.1%}"
              f"   (after {out['queued_settle_s']:.0f} s to read it once)")
        first = out["submits"][0]
        print(f"{'submit rate with the queue / empty queue':<44}"
              f"{r['rate'] / first['rate']:>12.2f}x   (both {first['clients']} clients)")
        label = f"submit with the queue, {r['clients']} clients"
        print(f"{label:<44}{r['rate']:>11.0f}/s"
              f"{r['rate'] / base:>19.2f}x   p50 {ms(r['p50'])} ms  p99 {ms(r['p99'])} ms  "
              f"errors {sum(r['errors'].values())}  created-2xx {r['dup_or_lost']}")
        print(f"{'GET jobs?limit=100 (first page)':<44}{ms(out['list_first_page']):>11} ms"
              f"   ({out['list_rows']} rows, median of {out['list_runs']})")
        print(f"{'batchyard job list, end to end':<44}{ms(out['cli_job_list']):>11} ms"
              f"   ({out['cli_note']})")
    for f in out["followers"]:
        print(f"{'/health with ' + str(f['followers']) + ' log followers':<44}"
              f"{'p50 ' + ms(f['p50']):>14}   p99 {ms(f['p99'])} ms  attached "
              f"{f['attached']}  timeouts {f['timeouts']}  answered {f['answered']}")
    if "tokens" in out:
        report_tokens(out["tokens"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", default="16,100,1000",
                        type=lambda s: [int(x) for x in s.split(",") if x])
    parser.add_argument("--min-jobs", type=int, default=1000,
                        help="submits per concurrency level (at least one per client)")
    parser.add_argument("--followers", default="45,200,1000",
                        type=lambda s: [int(x) for x in s.split(",") if x])
    parser.add_argument("--queued", type=int, default=0)
    parser.add_argument("--db", default=None, help="also run on this database URL")
    parser.add_argument("--slurm", action="store_true", help="sbatch on a real Slurm as anchor")
    parser.add_argument("--token-rounds", type=int, default=8,
                        help="rounds of submits with the admin token and a personal one, "
                        "alternating (0: skip)")
    parser.add_argument("--tokens-only", action="store_true",
                        help="measure only the personal-token / admin-token ratio")
    parser.add_argument("--workers", default="1",
                        help="server processes for the --db run (PostgreSQL: N or 'auto'; "
                        "`batchyard server start --workers`)")
    args = parser.parse_args()
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = [run(args, "sqlite")]
    report(results[0])  # now: a failing second run must not lose it
    if args.db:
        os.environ["BATCHYARD_DB_URL"] = args.db
        os.environ["BATCHYARD_WORKERS"] = args.workers
        try:
            results.append(run(args, f"{args.db.split('@')[-1]}, {args.workers} server "
                               f"process(es)"))
        finally:
            os.environ.pop("BATCHYARD_DB_URL", None)
            os.environ.pop("BATCHYARD_WORKERS", None)
        report(results[1])
    slim = [{k: v for k, v in out.items() if k not in ("health_seq", "get_seq")}
            | ({"health_seq_p50": pct(out["health_seq"], 0.5),
                "get_p50": pct(out["get_seq"], 0.5)} if "health_seq" in out else {})
            for out in results]
    print(json.dumps(slim, default=str))


if __name__ == "__main__":
    main()
