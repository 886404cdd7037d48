"""A real Ray cluster on this machine for the Ray backend tests: a head (no batchyard
resource) and raylets that each carry ``batchyard/<cluster>``, all with a small object store
and token authentication. Every node is stopped by pid (``ray stop`` would kill every raylet
on the host, other people's included)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from yardkit import pid_alive, pids_where

RAY = str(Path(sys.executable).parent / "ray")
STORE = "100000000"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2:].split()[1])


class RayCluster:
    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.tmp = Path(tempfile.mkdtemp(prefix="byray", dir="/tmp"))  # short: unix sockets
        self.token = secrets.token_hex(16)
        self.token_file = self.tmp / "token"
        self.token_file.write_text(self.token + "\n")
        self.token_file.chmod(0o600)
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.dashboard_port = 0
        self.nodes: dict[str, list[int]] = {}  # node label -> pids started by its `ray start`

    def _ours(self) -> set[int]:
        """Processes of this cluster: they name its temp dir, or (daemons the head starts
        after `ray start` returned, such as Ray's client server) its GCS port."""
        marker = str(self.tmp).encode()
        port = f":{self.port}".encode()

        def ours(blob: bytes) -> bool:
            return marker in blob or any(arg.startswith(b"--address=") and arg.endswith(port)
                                         for arg in blob.split(b"\0"))

        return set(pids_where(ours))

    def _start(self, label: str, args: list[str], env: dict[str, str] | None = None) -> None:
        before = self._ours()
        subprocess.run([RAY, "start", *args, "--object-store-memory", STORE,
                        "--disable-usage-stats"], env={**self.env, **(env or {})}, check=True,
                       timeout=180,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       stdin=subprocess.DEVNULL)
        known = {p for pids in self.nodes.values() for p in pids}
        for pid in list(known):
            known.update(descendants(pid))  # workers other raylets started meanwhile
        self.nodes[label] = sorted(self._ours() - before - known)

    def start_head(self, dashboard: bool = False) -> None:
        """``dashboard`` (needed by Ray's job submission SDK) costs memory: off by default."""
        self.dashboard_port = _free_port()
        self._start("head", ["--head", "--port", str(self.port), "--num-cpus", "0",
                             "--temp-dir", str(self.tmp), "--include-dashboard",
                             "true" if dashboard else "false", "--dashboard-port",
                             str(self.dashboard_port)])

    def add_raylet(self, label: str, cpus: int = 2, env: dict[str, str] | None = None) -> None:
        """``env`` reaches the raylet and what it starts (its workers, our actors and
        launchers), e.g. ``BATCHYARD_NODE_ROOT`` for a node work dir of the node's own."""
        self._start(label, ["--address", self.address, "--num-cpus", str(cpus),
                            "--resources", f'{{"{self.resource}": 1}}'], env)

    def raylet_pid(self, label: str) -> int:
        for pid in self.nodes[label]:
            with contextlib.suppress(OSError):
                if b"raylet/raylet" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
        raise AssertionError(f"no raylet among {label}'s processes")

    def label_of(self, pid: int) -> str | None:
        """The node whose raylet is an ancestor of ``pid``."""
        raylets = {self.raylet_pid(label): label for label in self.nodes if label != "head"}
        while pid > 1:
            if pid in raylets:
                return raylets[pid]
            try:
                pid = parent(pid)
            except (OSError, ValueError):
                return None
        return None

    def kill_node(self, label: str) -> list[int]:
        """SIGKILL a node as a dying machine would: its raylet, everything under it (workers,
        agents, their children) and the daemons its `ray start` left."""
        pids = list(self.nodes.pop(label))
        for pid in list(pids):
            pids += descendants(pid)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        """Everything started here, by pid: raylets (and their children) first, then the head."""
        for label in [x for x in self.nodes if x != "head"] + ["head"]:
            if label in self.nodes:
                self.kill_node(label)
        leftover = self._ours()
        for pid in leftover:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(pid_alive(p) for p in leftover):
            time.sleep(0.1)
        shutil.rmtree(self.tmp, ignore_errors=True)
