"""The per-node agent of the Ray backend: a detached, named Ray actor (one per node of an
attempt) living on its Ray node. It starts that node's launcher there exactly as the local
backend does on this machine: it writes the launcher's ticket (mode 0600) under the node's own
directory *on its own host* and runs ``python -S -m batchyard.node TICKET.json`` in a session
of its own. From then on the launcher talks to the server over the node channel (HTTP) like
every other launcher — states, logs, outputs, cancel/abort/finish and the MPI rsh relay — so
the raylet's host needs no disk in common with the server.

The actor only answers whether its launcher lives (pid and start time), kills what a dead one
left (by process tag), and, once the launchers of the whole gang have ended, removes the
gang's placement group, which ends the gang's actors with it.

This module imports nothing from Ray at import time: ``batchyard.backends.ray`` wraps
:class:`NodeAgent` with ``ray.remote`` when a Ray cluster is used."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from batchyard.launchplan import Ticket, node_attempt_dir, ticket_path
from batchyard.node import proctree
from batchyard.node.plan import AttemptPaths

# Ray's own variables (the cluster token above all) never reach the launcher or user code.
_SCRUB = ("RAY_",)
NAMESPACE = "batchyard"
WATCH_EVERY = 0.5  # how often a launcher that is not our child is looked at
SIBLING_WAIT = 10.0  # one call to a sibling actor
SIBLING_PATIENCE = 120.0  # a sibling that never answers counts as ended after this


def actor_name(attempt_uuid: str, node_rank: int) -> str:
    return f"batchyard-{attempt_uuid}-{node_rank}"


def scrubbed(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(_SCRUB)}




def node_directory(preferred: str, tail: str) -> str:
    """The node's work dir on the host this runs on (a Ray task pinned to the node runs it
    when the node is discovered): ``$BATCHYARD_NODE_ROOT/<tail>`` if the raylet was started
    with that variable; else ``preferred`` (the server's layout, as on the local backend) if
    it can be made here; else a directory under this host's temp dir."""
    root = os.environ.get("BATCHYARD_NODE_ROOT")
    candidates = [Path(root, tail)] if root else [
        Path(preferred), Path(tempfile.gettempdir(), f"batchyard-{os.getuid()}", tail)]
    for path in candidates:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK | os.X_OK):
            return str(path)
    raise RuntimeError(f"no writable node directory on {os.uname()[1]} (tried "
                       f"{', '.join(str(c) for c in candidates)})")


def kill_tagged(tag: str) -> int:
    """SIGKILL every process carrying the tag on this host (for a node whose actor is gone;
    unlike ``proctree.kill_everything`` it spares the caller's own children, since a pooled
    Ray worker's children are not the attempt's)."""
    pids = proctree.tagged_pids(tag)
    proctree.signal_all(pids, signal.SIGKILL)
    return len(pids)


class NodeAgent:
    """Lives on one Ray node for one node rank of one attempt; called by the server (and by
    its sibling actors, to learn when the whole gang has ended)."""

    def __init__(self, attempt_uuid: str, node_rank: int, siblings: list[str],
                 placement_group: str) -> None:
        self.attempt_uuid = attempt_uuid
        self.node_rank = node_rank
        self.siblings = siblings  # actor names, by node rank
        self.placement_group = placement_group
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.start_time: float | None = None
        self.node_dir: str | None = None
        self._lock = threading.Lock()

    # --- start ---------------------------------------------------------------------------

    def start(self, ticket: dict[str, Any], ca_pem: str | None,
              layout: dict[str, str]) -> dict[str, Any]:
        """Write the ticket on this host and start the launcher from it; idempotent (a second
        call, or a fresh actor on a node whose launcher already started, reports the launcher
        that runs: the launcher itself refuses to run twice, by its started marker)."""
        with self._lock:
            if self.pid is None:
                self._start(ticket, ca_pem, layout)
            return self.where()

    def _start(self, ticket: dict[str, Any], ca_pem: str | None,
               layout: dict[str, str]) -> None:
        from batchyard.backends.local import launcher_argv, launcher_env

        rank = self.node_rank
        node_dir = str(ticket["node_dir"])
        Path(node_dir).mkdir(parents=True, exist_ok=True)
        self.node_dir = node_dir
        path = ticket_path(node_dir, self.attempt_uuid, rank)
        ca_file = None
        if ca_pem:  # the server's CA, as a file of this host
            ca_path = path.with_name(f"{self.attempt_uuid}.{rank}.ca.pem")
            ca_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = ca_path.with_name(f".{ca_path.name}.{os.getpid()}.tmp")
            tmp.write_text(ca_pem)
            os.replace(tmp, ca_path)
            ca_file = str(ca_path)
        owner = self._marker_pid(node_dir, layout)
        if owner is not None and proctree.alive(owner):
            self.pid, self.start_time = owner, proctree.start_time(owner)
        else:
            Ticket(server=str(ticket["server"]), token=str(ticket["token"]),
                   attempt=self.attempt_uuid, node_rank=rank, node_dir=node_dir,
                   ca_file=ca_file, servers=[str(s) for s in ticket.get("servers") or []]
                   ).save(path)
            env = scrubbed(launcher_env())
            if not self._gpu_ids():  # Ray's CUDA_VISIBLE_DEVICES is the bundle's GPUs
                env.pop("CUDA_VISIBLE_DEVICES", None)
            with open(path.with_suffix(".launcher.out"), "ab") as log:
                self.proc = subprocess.Popen(
                    launcher_argv(str(path)), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=log, start_new_session=True, env=env, cwd=node_dir)
            self.pid, self.start_time = self.proc.pid, proctree.start_time(self.proc.pid)
        threading.Thread(target=self._watch, name="batchyard-watch", daemon=True).start()

    def _marker_pid(self, node_dir: str, layout: dict[str, str]) -> int | None:
        root = node_attempt_dir(node_dir, layout["workspace"], layout["experiment"],
                                layout["job"], self.attempt_uuid)
        try:
            return int(AttemptPaths(root).started(self.node_rank).read_text().strip())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _gpu_ids() -> list[Any]:
        import ray

        get: Any = ray.get_gpu_ids
        return list(get())

    def where(self) -> dict[str, Any]:
        import ray

        return {"pid": self.pid, "start_time": self.start_time, "node_dir": self.node_dir,
                "node_id": ray.get_runtime_context().get_node_id(), "host": os.uname()[1]}

    # --- liveness and stop ---------------------------------------------------------------

    def alive(self) -> bool:
        """Whether this node's launcher lives (a reused pid does not count)."""
        if self.proc is not None:
            return self.proc.poll() is None
        if self.pid is None:
            return False
        return proctree.alive(self.pid) and proctree.start_time(self.pid) == self.start_time

    def stop(self, tag: str) -> int:
        """Kill whatever the launcher left behind (it is dead or hung), found by its tag."""
        left = proctree.kill_everything(tag, grace=0.0)
        from batchyard.node.fuse import sweep as sweep_mounts

        sweep_mounts(tag)  # the FUSE/NFS mounts its teardown did not undo
        if self.alive() and self.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
        return left

    def exec(self, argv: list[str], cwd: str, env: dict[str, str],
             timeout: float | None) -> tuple[int, str, str]:
        return run_here(argv, cwd, env, timeout)

    # --- the end of the gang ---------------------------------------------------------------

    def _watch(self) -> None:
        """Once this launcher has ended, and every sibling's too, free the gang's placement
        group (this ends the actors). Each actor checks after its own launcher ended, so the
        last one to end always sees the whole gang done."""
        if self.proc is not None:
            self.proc.wait()
        else:
            while self.alive():
                time.sleep(WATCH_EVERY)
        for rank, name in enumerate(self.siblings):
            if rank != self.node_rank and self._sibling_alive(name):
                return  # that one frees the group when its launcher ends
        self._remove_group()

    @staticmethod
    def _sibling_alive(name: str) -> bool:
        import ray
        from ray.exceptions import GetTimeoutError

        deadline = time.monotonic() + SIBLING_PATIENCE
        while time.monotonic() < deadline:
            try:
                other = ray.get_actor(name, namespace=NAMESPACE)
                return bool(ray.get(other.alive.remote(), timeout=SIBLING_WAIT))
            except GetTimeoutError:
                continue  # busy, or its node is dying: ask again
            except Exception:  # no such actor, or it died (with its node)
                return False
        return False

    def _remove_group(self) -> None:
        from ray.util.placement_group import get_placement_group, remove_placement_group

        with contextlib.suppress(Exception):
            remove_placement_group(get_placement_group(self.placement_group))


def run_here(argv: list[str], cwd: str, env: dict[str, str],
             timeout: float | None) -> tuple[int, str, str]:
    """``exec`` on a Ray node (as a plain Ray task pinned to the node)."""
    full = scrubbed({**os.environ, **env})
    os.makedirs(cwd, exist_ok=True)
    try:
        proc = subprocess.run(argv, cwd=cwd, env=full, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
    except FileNotFoundError as exc:
        return 127, "", f"{exc}\n"
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return 124, out, f"timed out after {timeout}s\n"
    return proc.returncode, proc.stdout, proc.stderr
