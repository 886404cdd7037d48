"""The embedded backend: virtual nodes on this machine. Each node is a directory, a slice of
the machine's GPUs and an address (127.0.0.1); a node's share of an attempt is a detached
``python -m batchyard.node TICKET`` process in its own session, so it outlives the server.
Like every backend it only starts launchers and watches their pids: the launchers report over
the node channel (HTTP), exactly as on machines joined by `batchyard agent`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from batchyard.backends.base import Gang, NodeInfo
from batchyard.backends.dryrun import render_dry_run
from batchyard.config import data_root, home, server_file
from batchyard.errors import NoCapacity
from batchyard.launchplan import Ticket, node_attempt_dir, ticket_path
from batchyard.node import gpuclaims, proctree
from batchyard.node.container import node_containers
from batchyard.node.env import merged_environ
from batchyard.node.gpus import describe as gpu_describe
from batchyard.node.gpus import discover_gpus
from batchyard.node.plan import AttemptPaths
from batchyard.node.sandbox import HIDE_ENV, MODE_ENV


def host_gpus() -> list[int | str]:
    """The ids (for CUDA_VISIBLE_DEVICES) of this machine's GPUs (node/gpus.py)."""
    return [g["id"] for g in discover_gpus()]


class LocalBackend:
    name = "local"

    def check_health(self, directory: str, gpu_ids: list[int | str]) -> dict[str, Any]:
        """A virtual node's periodic health check: its work dir and its GPUs are this
        machine's (a node of an agent checks its own machine)."""
        from batchyard.node.healthcheck import run

        return run(directory, gpu_ids, sys.executable)

    def provision_node(self, cluster: str, workspace: str, index: int,
                       size: dict[str, Any]) -> NodeInfo:
        """A virtual node gets GPUs of its own (node/gpuclaims.py: no other virtual node or
        agent of this machine has them); a machine without GPUs gives none (the cluster
        was created with a warning)."""
        name = f"{cluster}-{index}"
        directory = data_root() / "clusters" / workspace / cluster / "nodes" / name
        gpus_wanted = int(size.get("gpus", 0))
        have = discover_gpus() if gpus_wanted else []
        devices: list[dict[str, Any]] = []
        if have:
            owner = gpuclaims.local_owner(str(directory), name)
            directory.mkdir(parents=True, exist_ok=True)  # (the claim lasts while it exists)
            try:
                devices = gpuclaims.claim(have, gpus_wanted, owner)
            except gpuclaims.NotEnoughGpus as exc:
                raise NoCapacity(f"node {name} ({size.get('name') or 'its size'}) {exc}"
                                 ) from None
        directory.mkdir(parents=True, exist_ok=True)
        resources = {
            "cpus": int(size.get("vcpus", 1)),
            "gpus": len(devices),
            "gpu_ids": [d["id"] for d in devices],
            "gpu_devices": gpu_describe(devices),
            "declared_gpus": gpus_wanted,
            "memory_gb": size.get("memory_gb"),
            "family": size.get("family"),
            "infiniband": bool(size.get("infiniband")),
            "containers": node_containers(),
        }
        return NodeInfo(name, index, "127.0.0.1", str(directory), resources)

    def remove_node(self, node: NodeInfo) -> None:
        shutil.rmtree(Path(node.directory) / "jobs", ignore_errors=True)
        shutil.rmtree(Path(node.directory) / "setup", ignore_errors=True)
        if node.resources.get("gpu_ids"):
            gpuclaims.release(gpuclaims.local_owner(node.directory, node.name)["key"])

    def gpu_shortfall(self, size: dict[str, Any], count: int) -> str | None:
        wanted = int(size.get("gpus") or 0) * count
        have = discover_gpus() if wanted else []
        if not have:
            return None  # no GPU here: the nodes offer none (cluster create warns)
        held = gpuclaims.taken(have)
        free = len(have) - len(held)
        if wanted <= free:
            return None
        label = size.get("name") or "this size"
        holders = sorted(set(held.values()))
        return (f"{count} node(s) of {label} need {wanted} GPU(s), but this machine has "
                f"{len(have)} and {free} of them {'is' if free == 1 else 'are'} free"
                + (f" (the others are held by {', '.join(holders)})" if holders else "")
                + ": a virtual node never shares a GPU")

    def start_setup(self, node: NodeInfo, command: str, env: dict[str, str]) -> None:
        setup = Path(node.directory) / "setup"
        setup.mkdir(parents=True, exist_ok=True)
        (setup / "exitcode").unlink(missing_ok=True)
        wrapper = ('bash -c "$1" >"$2/stdout.txt" 2>"$2/stderr.txt"; '
                   'echo $? >"$2/exitcode.tmp"; mv "$2/exitcode.tmp" "$2/exitcode"')
        full_env = merged_environ({
            "AZ_BATCHAI_MOUNT_ROOT": str(Path(node.directory) / "mounts"),
            "BATCHYARD_NODE_NAME": node.name, "BATCHYARD_NODE_DIR": node.directory, **env})
        subprocess.Popen(["bash", "-c", wrapper, "batchyard-setup", command, str(setup)],
                         cwd=node.directory, env=full_env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)

    def setup_result(self, node: NodeInfo) -> int | None:
        try:
            return int((Path(node.directory) / "setup" / "exitcode").read_text().strip())
        except (OSError, ValueError):
            return None

    def setup_files(self, node: NodeInfo) -> list[tuple[str, bytes]]:
        setup = Path(node.directory) / "setup"
        if not setup.is_dir():
            return []
        return [(f"{node.name}/setup/{p.name}", p.read_bytes()) for p in sorted(setup.iterdir())
                if p.is_file() and not p.name.endswith(".tmp")]

    def dry_run(self, gang: Gang) -> str:
        return render_dry_run(gang)

    def launch(self, gang: Gang) -> dict[str, Any]:
        """Idempotent: a launcher refuses to start twice for the same node of an attempt
        (its started marker), so a server that died mid-launch can simply launch again."""
        launchers = []
        for rank, node in enumerate(gang.nodes):
            ticket = Ticket(server=gang.server_url, token=gang.launch_tokens[rank],
                            attempt=gang.attempt_uuid, node_rank=rank, node_dir=node.directory,
                            ca_file=gang.ca_file, servers=list(gang.servers),
                            home_file=str(server_file()))  # this machine's server's address
            path = ticket_path(node.directory, gang.attempt_uuid, rank)
            owner = _marker_pid(node.directory, gang, rank)
            if owner is not None:
                launchers.append({"node_rank": rank, "pid": owner,
                                  "start_time": proctree.start_time(owner)})
                continue
            ticket.save(path)
            log = path.with_suffix(".launcher.out")
            pid, start_time = _ZYGOTE.spawn(str(path), str(log))
            launchers.append({"node_rank": rank, "pid": pid, "start_time": start_time})
        return {"backend": self.name, "launchers": launchers, "node_dirs":
                [n.directory for n in gang.nodes], "workspace": gang.workspace,
                "experiment": gang.experiment, "job": gang.job_name,
                "attempt": gang.attempt_uuid, "tags": [f"{gang.attempt_uuid}/{r}"
                                                      for r in range(len(gang.nodes))],
                "launched_at": time.time()}

    def alive(self, handle: dict[str, Any]) -> list[bool | None]:
        _reap()
        out: list[bool | None] = []
        for launcher in handle["launchers"]:
            rank = int(launcher["node_rank"])
            if _launcher_alive(launcher):
                out.append(True)
                continue
            owner = _handle_marker_pid(handle, rank)  # a twin won the start race
            out.append(owner is not None and proctree.alive(owner)
                       and owner != launcher.get("pid"))
        return out

    def stop(self, handle: dict[str, Any], node_rank: int) -> None:
        """Kill whatever a lost launcher left behind, found by its process tag, and the
        launcher itself if it is still there (silent: frozen, or unable to find its server)."""
        for launcher in handle.get("launchers") or []:
            if int(launcher["node_rank"]) == node_rank and _launcher_alive(launcher):
                with contextlib.suppress(OSError):
                    os.kill(int(launcher["pid"]), signal.SIGKILL)
        tags = handle.get("tags") or []
        if node_rank < len(tags):
            proctree.kill_everything(tags[node_rank], grace=0.0, own_children=False)
            from batchyard.node.fuse import sweep as sweep_mounts

            sweep_mounts(tags[node_rank])  # the FUSE/NFS mounts its teardown did not undo
            from batchyard.node.jobview import sweep as sweep_sandbox

            sweep_sandbox(tags[node_rank])  # its /dev/shm and cgroup
        if handle.get("attempt"):  # and the container its teardown did not remove
            from batchyard.node.container import remove_attempt

            threading.Thread(target=remove_attempt, args=(str(handle["attempt"]), node_rank),
                             daemon=True, name="remove-containers").start()
        dirs = handle.get("node_dirs") or []
        if node_rank < len(dirs):  # its last lines, in the background: never block the loop
            from batchyard.node.salvage import salvage_logs

            ticket = ticket_path(dirs[node_rank], handle["attempt"], node_rank)
            threading.Thread(target=salvage_logs, args=(ticket,), daemon=True,
                             name="salvage-logs").start()

    def exec(self, node: NodeInfo, argv: list[str], timeout: float) -> tuple[int, str, str]:
        from batchyard.node.nodeexec import run_on_node

        return run_on_node(argv, node.name, node.directory, timeout)


_CHILDREN: list[subprocess.Popen[bytes]] = []


class Zygote:
    """Client side of batchyard.node.zygote, with a plain spawn as the fallback."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-m", "batchyard.node.zygote"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
                env=launcher_env(), cwd="/", start_new_session=True)
        return self._proc

    def start(self) -> None:
        with self._lock:
            self._ensure()

    def spawn(self, ticket_file: str, log_path: str) -> tuple[int, float | None]:
        with self._lock:
            try:
                proc = self._ensure()
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{ticket_file}\t{log_path}\n")
                proc.stdin.flush()
                reply = proc.stdout.readline().split("\t")
                pid = int(reply[0])
                return pid, float(reply[1]) if reply[1].strip() != "None" else None
            except (OSError, ValueError, IndexError, AssertionError):
                self._proc = None
        with open(log_path, "ab") as log:
            child = subprocess.Popen(launcher_argv(ticket_file), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, start_new_session=True,
                                     env=launcher_env(), cwd="/")
        _CHILDREN.append(child)
        return child.pid, proctree.start_time(child.pid)


_ZYGOTE = Zygote()


def prestart() -> None:
    """Start the zygote ahead of the first job (called when the server starts)."""
    _ZYGOTE.start()
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def launcher_argv(ticket_file: str) -> list[str]:
    """``-S`` skips site-packages (and their .pth files): the launcher needs only the standard
    library and batchyard, and starts in a third of the time."""
    return [sys.executable, "-S", "-m", "batchyard.node", ticket_file]


def launcher_env() -> dict[str, str]:
    env = merged_environ({})
    user = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + user if user else "")
    env["BATCHYARD_LAUNCHER"] = "1"
    if user:
        env["BATCHYARD_USER_PYTHONPATH"] = user
    if os.environ.get("BATCHYARD_NO_FUSE"):  # the node's operator: copy, never FUSE-mount
        env["BATCHYARD_NO_FUSE"] = os.environ["BATCHYARD_NO_FUSE"]
    # the rank sandbox (node/sandbox.py) hides the server's home and data root from job code
    # (the node dirs live under them: the sandbox shows a job only its own)
    env[HIDE_ENV] = os.pathsep.join(dict.fromkeys(str(p) for p in (home(), data_root())))
    if os.environ.get(MODE_ENV):  # the node's operator: off
        env[MODE_ENV] = os.environ[MODE_ENV]
    return env


def _launcher_alive(launcher: dict[str, Any]) -> bool:
    pid = launcher.get("pid")
    if not pid or not proctree.alive(int(pid)):
        return False
    expected = launcher.get("start_time")
    return expected is None or proctree.start_time(int(pid)) == expected


def _marker_pid(node_dir: str, gang: Gang, rank: int) -> int | None:
    root = node_attempt_dir(node_dir, gang.workspace, gang.experiment, gang.job_name,
                            gang.attempt_uuid)
    return _read_pid(AttemptPaths(root).started(rank))


def _handle_marker_pid(handle: dict[str, Any], rank: int) -> int | None:
    dirs = handle.get("node_dirs") or []
    if rank >= len(dirs):
        return None
    root = node_attempt_dir(dirs[rank], handle["workspace"], handle["experiment"],
                            handle["job"], handle["attempt"])
    return _read_pid(AttemptPaths(root).started(rank))


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _reap() -> None:
    """The server is the launchers' parent while it lives: reap them so none lingers as a
    zombie (a zombie still looks alive to a pid check)."""
    for proc in list(_CHILDREN):
        if proc.poll() is not None:
            _CHILDREN.remove(proc)


class NodeSession(Protocol):
    """The server's side of one ``cluster node exec`` session (services/exec_sessions.py)."""

    ident: str
    argv: list[str]
    tty: bool
    node_name: str

    def node_out(self, seq: int, body: dict[str, Any]) -> None: ...

    def wait_input(self, after: int, timeout: float) -> tuple[list[dict[str, Any]], bool]: ...


def run_node_session(sess: NodeSession, directory: str, size: tuple[int, int],
                     term: str) -> None:
    """``cluster node exec`` on a virtual node: its command in a pty (or on pipes) on this
    machine, its bytes through ``sess`` (the server's session, as an agent's would be)."""
    import base64

    from batchyard.node.session import DEFAULT_SHELL, Process

    env = merged_environ({"BATCHYARD_NODE_NAME": sess.node_name,
                          "BATCHYARD_NODE_DIR": directory, "TERM": term})
    try:
        proc = Process(sess.argv or list(DEFAULT_SHELL), env, directory or "/", sess.tty,
                       size[0], size[1])
    except OSError as exc:
        sess.node_out(1, {"error": f"could not start {sess.argv}: {exc}", "exit_code": 127})
        return
    seq = [0]

    def up(body: dict[str, Any]) -> None:
        seq[0] += 1
        sess.node_out(seq[0], body)

    def feed() -> None:
        after = 0
        while True:
            items, closed = sess.wait_input(after, 1.0)
            for item in items:
                after = int(item["seq"])
                if "data" in item:
                    proc.write(base64.b64decode(item["data"]))
                elif "resize" in item:
                    proc.resize(*item["resize"])
                elif item.get("eof"):
                    proc.end_input()
            if closed:
                if proc.exited() is None:
                    proc.kill()
                return

    up({"started": True})
    threading.Thread(target=feed, daemon=True, name=f"exec-in-{sess.ident}").start()
    for got in proc.chunks():
        up({k: base64.b64encode(v).decode() for k, v in got.items()})
    up({"exit_code": proc.wait()})
