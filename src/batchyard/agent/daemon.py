"""The agent loop: join once (join token -> this node's own credential), then heartbeat.
Each heartbeat carries the launchers this machine runs and answers which (attempt, node
rank) pairs it should run: the agent starts the missing ones (detached, so an agent restart
re-attaches to them), sweeps the ones the server no longer lists (SIGTERM, a grace to send
their last logs, then everything carrying their process tag), and runs queued commands."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchyard import __version__, tlstrust
from batchyard.agent import machine
from batchyard.agent.usage import MachineUsage
from batchyard.launchplan import Ticket, read_json, ticket_path, write_json_atomic
from batchyard.node import proctree

log = logging.getLogger("batchyard.agent")
SWEEP_GRACE = 15.0


class AgentError(Exception):
    """A fault the agent cannot work around (refused join, wrong CA pin)."""


@dataclass
class AgentConfig:
    server: str
    join_token: str | None
    work_dir: Path
    ca_sha256: str | None = None
    ca_file: str | None = None
    name: str | None = None
    cpus: int | None = None
    gpus: int | None = None
    memory: float | None = None


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.server = cfg.server.rstrip("/")
        self.work = cfg.work_dir
        self.state_file = self.work / "agent.json"
        self.ca_file: str | None = cfg.ca_file
        self.node = ""
        self.credential = ""
        self.interval = 5.0
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping: dict[str, float] = {}
        self.done_commands: set[int] = set()
        self._stop = threading.Event()
        self.usage = MachineUsage()  # CPU, memory, GPUs for /metrics (agent/usage.py)
        self.health: dict[str, Any] | None = None  # a finished check, for the next beat
        self._checking = threading.Event()

    # --- set-up -----------------------------------------------------------------------------

    def trust(self) -> None:
        if not self.server.startswith("https:") or self.ca_file:
            return
        if not self.cfg.ca_sha256:
            return  # the system's CAs (a certificate the admin gave the server)
        pinned = self.work / "ca.pem"
        if pinned.is_file() and tlstrust.fingerprint_pem(pinned.read_text()) == \
                tlstrust.normalize_pin(self.cfg.ca_sha256):
            self.ca_file = str(pinned)
            return
        try:
            pem = tlstrust.fetch_pinned_ca(self.server, self.cfg.ca_sha256)
        except tlstrust.PinMismatch as exc:
            raise AgentError(f"--ca-sha256: {exc}") from None
        pinned.parent.mkdir(parents=True, exist_ok=True)
        pinned.write_text(pem)
        self.ca_file = str(pinned)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             token: str | None = None, timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
        return tlstrust.urlopen_json(method, f"{self.server}/api/v1{path}", body, token,
                                     self.ca_file, timeout)

    def join(self) -> None:
        saved = read_json(self.state_file) or {}
        if saved.get("server") == self.server and saved.get("credential"):
            self.node, self.credential = saved["node"], saved["credential"]
            return
        if not self.cfg.join_token:
            raise AgentError("--join-token: needed to join (this machine has not joined yet)")
        body = {"join_token": self.cfg.join_token, "machine_id": machine.machine_id(self.work),
                "hostname": __import__("socket").gethostname(), "name": self.cfg.name,
                "address": machine.routable_address(self.server), "work_dir": str(self.work),
                "resources": machine.resources(self.cfg.cpus, self.cfg.gpus, self.cfg.memory,
                                               self.work),
                "version": __version__}
        status, reply = self.call("POST", "/agent/join", body)
        if status != 200:
            message = (reply.get("error") or {}).get("message") or f"HTTP {status}"
            raise AgentError(f"join refused: {message}")
        self.node, self.credential = reply["node"], reply["credential"]
        self.interval = float(reply.get("heartbeat_interval") or 5.0)
        write_json_atomic(self.state_file, {"server": self.server, "node": self.node,
                                            "credential": self.credential}, mode=0o600)
        log.info("joined cluster %s as node %s at %s", reply.get("cluster"), self.node,
                 body["address"])

    # --- launchers --------------------------------------------------------------------------

    def _records(self) -> dict[str, dict[str, Any]]:
        out = {}
        folder = self.work / "launchers"
        if folder.is_dir():
            for path in folder.glob("*.json"):
                data = read_json(path)
                if isinstance(data, dict):
                    out[path.stem] = data
        return out

    @staticmethod
    def _alive(record: dict[str, Any]) -> bool:
        pid = int(record.get("pid") or 0)
        if not pid or not proctree.alive(pid):
            return False
        return proctree.start_time(pid) == record.get("start_time")

    def _start(self, want: dict[str, Any]) -> None:
        from batchyard.backends.local import launcher_argv, launcher_env

        uuid_, rank = str(want["attempt"]), int(want["node_rank"])
        key = f"{uuid_}.{rank}"
        ticket = Ticket(server=self.server, token=str(want["token"]), attempt=uuid_,
                        node_rank=rank, node_dir=str(self.work), ca_file=self.ca_file)
        path = ticket_path(str(self.work), uuid_, rank)
        ticket.save(path)
        attempt_dir = Path(str(want["attempt_dir"]))
        attempt_dir.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".launcher.out"), "ab") as out:
            proc = subprocess.Popen(launcher_argv(str(path)), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=out, start_new_session=True,
                                    env=launcher_env(), cwd=str(attempt_dir))
        self.children[key] = proc
        write_json_atomic(self.work / "launchers" / f"{key}.json",
                          {"attempt": uuid_, "node_rank": rank, "pid": proc.pid,
                           "start_time": proctree.start_time(proc.pid), "tag": f"{uuid_}/{rank}",
                           "ticket": str(path)})
        log.info("started the launcher of attempt %s node %d (pid %d)", uuid_, rank, proc.pid)

    def _sweep(self, key: str, record: dict[str, Any], now: float) -> bool:
        """True once nothing of that launcher is left."""
        if self._alive(record):
            first = self.stopping.setdefault(key, now)
            if now - first < SWEEP_GRACE:
                if first == now:
                    os.kill(int(record["pid"]), signal.SIGTERM)
                return False
            os.kill(int(record["pid"]), signal.SIGKILL)
        proctree.kill_everything(str(record["tag"]), grace=0.0, own_children=False)
        from batchyard.node.fuse import sweep as sweep_mounts

        sweep_mounts(str(record["tag"]))  # the FUSE/NFS mounts its teardown did not undo
        from batchyard.node.jobview import sweep as sweep_sandbox

        sweep_sandbox(str(record["tag"]))  # its /dev/shm and cgroup
        if record.get("attempt") is not None:  # the container its teardown did not remove
            from batchyard.node.container import remove_attempt

            remove_attempt(str(record["attempt"]), int(record.get("node_rank") or 0))
        if record.get("ticket"):
            from batchyard.node.salvage import salvage_logs

            salvage_logs(Path(str(record["ticket"])), timeout=10.0)  # what it left unsent
        self.stopping.pop(key, None)
        (self.work / "launchers" / f"{key}.json").unlink(missing_ok=True)
        Path(str(record.get("ticket") or "/nonexistent")).unlink(missing_ok=True)
        log.info("swept the launcher of attempt %s node %s", record.get("attempt"),
                 record.get("node_rank"))
        return True

    def reconcile(self, wanted: list[dict[str, Any]]) -> None:
        for proc in list(self.children.values()):
            proc.poll()  # reap our own children: a zombie still looks alive
        now = time.time()
        keys = {f"{w['attempt']}.{int(w['node_rank'])}": w for w in wanted}
        records = self._records()
        for key, record in records.items():
            if key not in keys:
                self._sweep(key, record, now)
        for key, want in keys.items():
            if key not in records:
                self._start(want)

    def launcher_report(self) -> list[dict[str, Any]]:
        return [{"attempt": r.get("attempt"), "node_rank": r.get("node_rank"),
                 "alive": self._alive(r)} for r in self._records().values()]

    # --- commands ---------------------------------------------------------------------------

    def run_command(self, command: dict[str, Any]) -> None:
        ident = int(command["id"])
        if ident in self.done_commands:
            return
        self.done_commands.add(ident)
        threading.Thread(target=self._exec, args=(command,), daemon=True).start()

    def _exec(self, command: dict[str, Any]) -> None:
        from batchyard.node.nodeexec import run_on_node

        payload = command.get("payload") or {}
        if command.get("kind") == "session":  # cluster node exec -it (node/session.py)
            from batchyard.node.session import on_machine

            code = on_machine(lambda m, p, b, t: self.call(m, p, b, self.credential, t),
                              f"/agent/nodes/{self.node}", payload, str(self.node),
                              str(self.work))
            out = err = ""
        else:
            code, out, err = run_on_node([str(a) for a in payload.get("argv") or []],
                                         self.node, str(self.work),
                                         float(payload.get("timeout") or 60.0))
        result = {"exit_code": code, "stdout": out[-1_000_000:], "stderr": err[-1_000_000:]}
        for _ in range(30):
            try:
                self.call("POST", f"/agent/nodes/{self.node}/commands/{command['id']}", result,
                          self.credential)
                return
            except OSError:
                time.sleep(1.0)

    # --- health checks (cluster health_check_every) -----------------------------------------

    def health_check(self, want: dict[str, Any]) -> None:
        """The server asks when this idle (or unusable) node is due; the check runs in a
        thread and its result goes with the next heartbeat (node/healthcheck.py)."""
        if self._checking.is_set() or self.health is not None:
            return
        self._checking.set()

        def work() -> None:
            from batchyard.node.healthcheck import run

            try:
                self.health = run(str(self.work), list(want.get("gpu_ids") or []), None,
                                  self.server, self.ca_file)
            except Exception as exc:  # a check that breaks is a failed check, named
                self.health = {"at": time.time(), "ok": False, "checks": [], "reason":
                               f"the check itself failed: {type(exc).__name__}: {exc}"}
            finally:
                self._checking.clear()

        threading.Thread(target=work, name="health-check", daemon=True).start()

    # --- the loop ---------------------------------------------------------------------------

    def beat(self, wait: float) -> dict[str, Any] | None:
        """One heartbeat; the server holds it up to ``wait`` seconds until there is work."""
        from batchyard.node.container import node_containers

        body: dict[str, Any] = {"launchers": self.launcher_report(),
                                "containers": node_containers() or {},
                                "usage": self.usage.latest}
        sent, self.health = self.health, None
        if sent is not None:
            body["health"] = sent
        if self._checking.is_set():
            body["checking"] = True
        try:
            status, reply = self.call("POST", f"/agent/nodes/{self.node}/heartbeat?wait="
                                      f"{wait:g}", body, self.credential, timeout=15.0 + wait)
        except OSError as exc:
            log.warning("server unreachable (%s); launchers keep running", exc)
            self.health = self.health or sent
            return None
        if status == 401:
            log.warning("the server no longer knows this node's credential; joining again")
            self.state_file.unlink(missing_ok=True)
            self.join()
            return None
        if status != 200:
            log.warning("heartbeat refused: HTTP %s %s", status, reply)
            return None
        return reply

    def run(self) -> int:
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o700)
        self.trust()
        self.join()
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        log.info("agent for node %s running; work dir %s", self.node, self.work)
        self.usage.start()
        while not self._stop.is_set():
            wait = min(self.interval, 1.0) if self.stopping else self.interval
            started = time.monotonic()
            reply = self.beat(wait)
            if reply is not None:
                self.interval = float(reply.get("heartbeat_interval") or self.interval)
                self.reconcile(list(reply.get("run") or []))
                for command in reply.get("commands") or []:
                    self.run_command(command)
                if reply.get("health_check"):
                    self.health_check(dict(reply["health_check"]))
            # The server's long poll paces the beats (it answers at once only when there is
            # work); after an error, or a quick answer with nothing to do, wait out the rest.
            elapsed = time.monotonic() - started
            busy = reply is not None and bool(reply.get("run") or reply.get("commands"))
            paced = reply is not None and (busy or elapsed >= wait * 0.5)
            self._stop.wait(0.05 if paced else max(0.05, wait - elapsed))
        log.info("agent stopping; its launchers keep running and are re-attached at restart")
        return 0




def main(cfg: AgentConfig) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return Agent(cfg).run()
    except AgentError as exc:
        log.error("%s", exc)
        return 2
    except json.JSONDecodeError as exc:
        log.error("the server's answer was not JSON: %s", exc)
        return 1
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        # joining (or fetching the CA to pin) needs the server; heartbeats wait for it
        log.error("cannot reach the server at %s: %s", cfg.server, exc)
        return 1
