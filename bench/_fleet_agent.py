"""Simulated `batchyard agent`s for bench/fleet_sim.py: many per process on one event loop,
speaking the real protocol over HTTP as the real ones do (src/batchyard/agent/daemon.py,
node/channel.py, sdk/metrics.py), with nothing run on this machine:

* an agent joins with the cluster's join token (POST /agent/join), then heartbeats as
  ``Agent.run`` does: a long poll of ``heartbeat_interval`` seconds, answered at once when
  the server has work for it, the next one 50 ms after an answer;
* for each (attempt, node rank) a heartbeat lists, a simulated launcher fetches its plan,
  meets its gang at the rendezvous, reports ``preparing`` then ``running``, re-reports its
  status every 2 s (the usage sampler's new sample: a new seq each time), long-polls its
  control, ships each rank's log lines (``--lines`` a second per rank, each carrying the
  time it was written) with the real shipper's rhythm (a look every 50 ms, everything new
  since the last acknowledged offset in one POST), posts each rank's metrics once a second
  with the job token (the SDK's reporter), and after the job's ``sleep N`` reports
  ``succeeded``, drains its logs and is reported dead in the next heartbeat;
* calls open a connection each, as urllib does in the real agent and launcher (``--keepalive``
  reuses them instead).

It prints one JSON object when it gets SIGTERM (or its stdin closes): what it measured."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import sys
import time
import uuid
from array import array
from typing import Any

import aiohttp

LOG_TICK = 0.05  # node/channel.py
SAMPLE_EVERY = 2.0  # node/usage.py: a status with a new sample (a new seq)
LONG_POLL = 20.0  # node/channel.py: the control long poll
METRICS_EVERY = 1.0  # sdk/metrics.py Reporter's interval
LINE_PAD = 60  # bytes of text after the stamp: ~100-byte lines


class Stats:
    def __init__(self) -> None:
        self.lat: dict[str, tuple[array[float], array[float]]] = {}  # kind -> (end, rtt)
        self.hb_excess: tuple[array[float], array[float]] = (array("d"), array("d"))
        self.hb_gap_max: dict[str, float] = {}
        self.lost: set[str] = set()
        self.errors: dict[str, int] = {}
        self.messages: dict[str, int] = {}
        self.runs: list[dict[str, Any]] = []
        self.joined: list[float] = []
        self.closed = False  # stopping: calls cut short now are not the server's errors

    def note(self, kind: str, end: float, rtt: float) -> None:
        ends, rtts = self.lat.setdefault(kind, (array("d"), array("d")))
        ends.append(end)
        rtts.append(rtt)

    def error(self, kind: str, what: str, text: str = "") -> None:
        if self.closed:
            return
        key = f"{kind}:{what}"
        self.errors[key] = self.errors.get(key, 0) + 1
        if text:
            msg = f"{key} {text[:100]}"
            self.messages[msg] = self.messages.get(msg, 0) + 1

    def dump(self) -> dict[str, Any]:
        return {"lat": {k: [list(e), list(r)] for k, (e, r) in self.lat.items()},
                "hb_excess": [list(self.hb_excess[0]), list(self.hb_excess[1])],
                "hb_gap_max": self.hb_gap_max, "lost": sorted(self.lost),
                "errors": dict(self.errors), "messages": dict(sorted(
                    self.messages.items(), key=lambda kv: -kv[1])[:10]),
                "runs": self.runs, "joined": self.joined}


class Http:
    def __init__(self, stats: Stats, keepalive: bool) -> None:
        self.stats = stats
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=not keepalive))

    async def call(self, kind: str, method: str, url: str, token: str,
                   body: Any = None, timeout: float = 30.0) -> Any:
        """The answer's JSON, or None after an error (counted under ``kind``)."""
        t0 = time.time()
        try:
            async with self.session.request(
                    method, url, json=body, headers={"Authorization": f"Bearer {token}"},
                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                data = await resp.read()
                status = resp.status
        except asyncio.TimeoutError:
            self.stats.error(kind, "timeout")
            return None
        except (aiohttp.ClientError, OSError) as exc:
            self.stats.error(kind, "broken", repr(exc))
            return None
        end = time.time()
        if status >= 400:
            self.stats.error(kind, "5xx" if status >= 500 else str(status),
                             data.decode(errors="replace"))
            return None
        self.stats.note(kind, end, end - t0)
        return json.loads(data or b"null")


class Launcher:
    """One node's share of one attempt, simulated."""

    def __init__(self, agent: Agent, want: dict[str, Any]) -> None:
        self.agent = agent
        self.attempt, self.rank = str(want["attempt"]), int(want["node_rank"])
        self.token = str(want["token"])
        self.base = (f"{agent.server}/api/v1/node/attempts/{self.attempt}/nodes/{self.rank}")
        self.alive = True
        self.seq = 0
        self.status: dict[str, Any] = {}
        self.control_version = -1
        self.stop: asyncio.Event = asyncio.Event()
        self.files: dict[str, tuple[float, float]] = {}  # name -> (start, phase)
        self.acked: dict[str, int] = {}
        self.unacked: dict[str, bytearray] = {}  # written, not yet acknowledged
        self.written: dict[str, int] = {}  # lines
        self.record: dict[str, Any] = {"attempt": self.attempt, "rank": self.rank,
                                       "wanted": time.time(), "node": agent.name}

    async def report(self, **changes: Any) -> None:
        self.seq += 1
        self.status.update(changes, updated_at=time.time())
        reply = await self.agent.http.call("status", "POST", self.base + "/status", self.token,
                                           {"seq": self.seq, "status": self.status})
        if isinstance(reply, dict) and isinstance(reply.get("control"), dict):
            self.on_control(int(reply.get("version", -1)), reply["control"])

    def on_control(self, version: int, control: dict[str, Any]) -> None:
        if version <= self.control_version:
            return
        self.control_version = version
        if control.get("cancel") or control.get("abort"):
            self.record["stopped"] = "cancel" if control.get("cancel") else "abort"
            self.stop.set()

    async def run(self) -> None:
        http, rec = self.agent.http, self.record
        try:
            plan = await http.call("plan", "GET", self.base + "/plan", self.token)
            if not isinstance(plan, dict):
                rec["failed"] = "plan"
                return
            rec.update(job=plan["job_name"], plan=time.time())
            self.status = {"node_rank": self.rank, "node": self.agent.name, "pid": 1,
                           "state": "preparing", "ranks": [], "started_at": time.time()}
            await self.report()
            if not await self.rendezvous():
                rec["failed"] = "rendezvous"
                return
            ppn = int(plan["distribution"].get("processes_per_node") or 1)
            first = self.rank * ppn
            ranks = [{"rank": first + i, "local_rank": i, "pid": 1000 + i, "exit_code": None}
                     for i in range(ppn)]
            start = time.time()
            for i in range(ppn):
                self.files[f"{self.agent.name}-rank{first + i}.stdout.txt"] = (
                    start, random.random() / self.agent.lines if self.agent.lines else 0.0)
            await self.report(state="running", running_at=start, ranks=ranks)
            rec["running"] = time.time()
            seconds = _sleep_of(plan.get("command"))
            tasks = [asyncio.create_task(t) for t in (
                self.control(), self.sampler(), self.shipper(),
                *(self.metrics(plan, first + i) for i in range(ppn)))]
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), seconds)
            self.stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            state = "succeeded" if "stopped" not in rec else "canceled"
            for r in ranks:
                r["exit_code"] = 0 if state == "succeeded" else 143
            await self.ship_all()
            await self.report(state=state, ended_at=time.time(), ranks=ranks, exit_code=0)
            rec["ended"] = time.time()
        finally:
            self.alive = False
            self.agent.stats.runs.append(rec)

    async def rendezvous(self) -> bool:
        http = self.agent.http
        got = await http.call("rendezvous", "POST", self.base + "/rendezvous", self.token,
                              {"ports": [random.randint(20000, 60000)]})
        deadline = time.time() + 600
        while time.time() < deadline:
            if isinstance(got, dict) and got.get("complete"):
                return True
            if isinstance(got, dict) and got.get("stop"):
                return False
            if got is None:
                await asyncio.sleep(0.2)
            got = await http.call("rendezvous_wait", "GET", self.base + "/rendezvous?wait=20",
                                  self.token, timeout=LONG_POLL + 10)
        return False

    async def control(self) -> None:
        while not self.stop.is_set():
            reply = await self.agent.http.call(
                "control", "GET", f"{self.base}/control?version={self.control_version}"
                f"&wait={LONG_POLL:g}", self.token, timeout=LONG_POLL + 10)
            if isinstance(reply, dict) and isinstance(reply.get("control"), dict):
                self.on_control(int(reply.get("version", -1)), reply["control"])
            elif reply is None:
                await asyncio.sleep(0.2)

    async def sampler(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY)
            await self.report(util={"ts": time.time(), "cpu_percent": 97.0,
                                    "job_cpu_cores": 1.9, "job_rss_bytes": 1 << 30,
                                    "mem_used_bytes": 8 << 30, "mem_total_bytes": 32 << 30,
                                    "mem_percent": 25.0, "gpus": []})

    def _pending(self, now: float) -> dict[str, list[Any]]:
        """What each rank has 'written' by ``now`` beyond the acknowledged offset."""
        rate = self.agent.lines
        out: dict[str, list[Any]] = {}
        for name, (start, phase) in self.files.items():
            buf = self.unacked.setdefault(name, bytearray())
            if rate:
                count = int((now - start - phase) * rate) + 1 if now >= start + phase else 0
                for i in range(self.written.get(name, 0), count):
                    stamp = start + phase + i / rate
                    line = f"FLEET {i} {stamp:.6f} "
                    buf += (line + "x" * max(0, LINE_PAD + 40 - len(line)) + "\n").encode()
                self.written[name] = max(count, self.written.get(name, 0))
            if buf or name not in self.acked:
                out[name] = [self.acked.get(name, 0), base64.b64encode(bytes(buf)).decode()]
        return out

    async def ship_once(self) -> bool:
        """True when something was sent and taken."""
        files = self._pending(time.time())
        if not files:
            return False
        reply = await self.agent.http.call("logs", "POST", self.base + "/logs", self.token,
                                           {"files": files})
        if not isinstance(reply, dict):
            return False
        for name, size in (reply.get("sizes") or {}).items():
            old = self.acked.get(name, 0)
            if int(size) > old and name in self.unacked:
                del self.unacked[name][:int(size) - old]
            self.acked[name] = int(size)
        return True

    async def shipper(self) -> None:
        while True:
            await self.ship_once()
            await asyncio.sleep(LOG_TICK)

    async def ship_all(self) -> None:
        for _ in range(5):
            if not await self.ship_once():
                return

    async def metrics(self, plan: dict[str, Any], rank: int) -> None:
        if not plan.get("api_url") or not plan.get("api_token"):
            return
        url = (f"{plan['api_url'].rstrip('/')}/api/v1/workspaces/{plan['workspace']}"
               f"/experiments/{plan['experiment']}/jobs/{plan['job_name']}/metrics")
        step = 0
        while True:
            await asyncio.sleep(METRICS_EVERY)
            step += 10
            now = time.time()
            items = [{"name": n, "value": random.random(), "kind": "scalar", "step": step,
                      "rank": rank, "attempt": int(plan.get("attempt") or 1), "ts": now}
                     for n in ("loss", "accuracy")]
            await self.agent.http.call("metrics", "POST", url, str(plan["api_token"]),
                                       {"metrics": items, "batch": uuid.uuid4().hex})


def _sleep_of(command: Any) -> float:
    words = command.split() if isinstance(command, str) else list(command or [])
    for i, word in enumerate(words[:-1]):
        if word == "sleep":
            return float(words[i + 1])
    return 30.0


class Agent:
    def __init__(self, index: int, cfg: argparse.Namespace, http: Http, stats: Stats) -> None:
        self.index = index
        self.cfg = cfg
        self.server = cfg.server.rstrip("/")
        self.http, self.stats = http, stats
        self.name = f"{cfg.prefix}{index}"
        self.node = ""
        self.credential = ""
        self.interval = 2.0
        self.lines = cfg.lines
        self.launchers: dict[str, Launcher] = {}

    async def join(self, stop: asyncio.Event) -> bool:
        body = {"join_token": self.cfg.join_token, "machine_id": uuid.uuid4().hex,
                "hostname": self.name, "name": self.name, "address": "127.0.0.1",
                "work_dir": f"/var/lib/fleet-sim/{self.name}",
                "resources": {"cpus": 8, "gpus": 0, "gpu_ids": [], "memory_gb": 32.0,
                              "machine_cpus": 8, "containers": None},
                "version": "fleet-sim"}
        delay = 0.5
        while not stop.is_set():
            reply = await self.http.call("join", "POST", f"{self.server}/api/v1/agent/join",
                                         "", body, timeout=60.0)
            if isinstance(reply, dict):
                self.node, self.credential = reply["node"], reply["credential"]
                self.interval = float(reply.get("heartbeat_interval") or 2.0)
                self.stats.joined.append(time.time())
                return True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
        return False

    def launcher_report(self) -> list[dict[str, Any]]:
        return [{"attempt": la.attempt, "node_rank": la.rank, "alive": la.alive}
                for la in self.launchers.values()]

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.sleep(random.random() * self.cfg.ramp)
        if not await self.join(stop):
            return
        last = time.time()
        url = f"{self.server}/api/v1/agent/nodes/{self.node}/heartbeat"
        while not stop.is_set():
            wait = self.interval
            body = {"launchers": self.launcher_report(), "containers": {}}
            t0 = time.time()
            gap = t0 - last
            self.stats.hb_gap_max[self.name] = max(self.stats.hb_gap_max.get(self.name, 0.0),
                                                   gap)
            reply = await self.http.call("heartbeat", "POST", f"{url}?wait={wait:g}",
                                         self.credential, body, timeout=15.0 + wait)
            end = time.time()
            last = t0
            if not isinstance(reply, dict):
                await asyncio.sleep(min(wait, 1.0))
                continue
            if reply.get("state") == "lost":
                self.stats.lost.add(self.name)
            self.interval = float(reply.get("heartbeat_interval") or self.interval)
            wanted = {f"{w['attempt']}.{int(w['node_rank'])}": w for w in reply.get("run") or []}
            fresh = [k for k in wanted if k not in self.launchers]
            rtt = end - t0
            if not fresh and not reply.get("commands") and rtt >= wait:
                # held the whole ``wait`` (nothing came for it): the rest is the server's
                # latency; an answer that brought work came when the work did, unmeasurable
                self.stats.hb_excess[0].append(end)
                self.stats.hb_excess[1].append(rtt - wait)
            for key in fresh:
                la = Launcher(self, wanted[key])
                self.launchers[key] = la
                asyncio.get_running_loop().create_task(la.run())
            for key in [k for k, la in self.launchers.items() if k not in wanted and
                        not la.alive]:
                del self.launchers[key]
            paced = bool(fresh) or rtt >= wait * 0.5
            await asyncio.sleep(0.05 if paced else max(0.05, wait - rtt))


async def main_async(cfg: argparse.Namespace) -> dict[str, Any]:
    stats = Stats()
    http = Http(stats, cfg.keepalive)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not os.read(
        sys.stdin.fileno(), 1) else None)
    agents = [Agent(i, cfg, http, stats) for i in range(cfg.first, cfg.first + cfg.count)]
    tasks = [asyncio.create_task(a.run(stop)) for a in agents]
    await stop.wait()
    stats.closed = True
    for t in asyncio.all_tasks() - {asyncio.current_task()}:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    cpu = os.times()
    out = stats.dump()
    out["cpu_s"] = cpu.user + cpu.system
    await http.session.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--join-token", required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--prefix", default="sim")
    parser.add_argument("--lines", type=float, default=10.0)
    parser.add_argument("--ramp", type=float, default=10.0,
                        help="agents join spread over this many seconds")
    parser.add_argument("--keepalive", action="store_true")
    cfg = parser.parse_args()
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out = asyncio.run(main_async(cfg))
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
