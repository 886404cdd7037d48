"""Relay execs, a share of the launcher (a mixin of node.launcher.Launcher): the commands
mpirun's rsh agent on node 0 (or a launcher of this attempt on this machine) asks a node to
run, an orted, inside that node's job context, with exit codes reported instead of reaped."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path
from typing import Any

from batchyard.node import proctree
from batchyard.node.env import merged_environ, node_dirs, node_env
from batchyard.node.ompi import node_mca_env
from batchyard.node.plan import AttemptPaths, NodePlan
from batchyard.node.sandbox import Sandbox
from batchyard.node.session import Sessions


class RelayExecs:
    plan: NodePlan
    paths: AttemptPaths
    sessions: Sessions
    sandbox: Sandbox | None
    box: str | None
    base_env: dict[str, str]
    execs: dict[int, str]  # pid -> relay exec id
    exec_done: dict[str, int]
    exec_socket: Any
    ranks: dict[int, dict[str, Any]]
    _exec_queue: list[dict[str, Any]]
    _exec_seen: set[str]
    _exec_lock: threading.Lock
    _local_execs: int
    _wake: threading.Event

    @property
    def _session_base(self) -> Path:  # the launcher's
        raise NotImplementedError

    def say(self, message: str) -> None:  # the launcher's
        raise NotImplementedError

    def write_status(self, **changes: Any) -> None:  # the launcher's
        raise NotImplementedError

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: Path, out: Path,
               err: Path, inside: bool = False,
               stdin_data: bytes | None = None) -> subprocess.Popen[bytes]:  # the launcher's
        raise NotImplementedError

    def _reap(self) -> list[tuple[int, int]]:
        """reap_children, minus the relay's execs (their exit codes are reported instead),
        after starting the execs that were asked for."""
        with self._exec_lock:
            queued, self._exec_queue = self._exec_queue, []
        for request in queued:
            self._start_exec(request)
        out = []
        for pid, status in proctree.reap_children():
            if self.sessions.claim(pid, status):
                continue
            ident = self.execs.pop(pid, None)
            if ident is None:
                out.append((pid, status))
                continue
            self._exec_ended(ident, proctree.exit_code(status))
            self.ranks.pop(-100 - pid, None)
            self.write_status()
        return out

    def _submit_exec(self, command: str) -> str:
        """A relay exec from a launcher of this attempt on this machine (node/relaysock.py's
        ExecSocket): queued for the main loop as the server's are."""
        with self._exec_lock:
            self._local_execs += 1
            ident = f"{self.plan.node_rank}-local-{self._local_execs}"
            self._exec_seen.add(ident)
            self._exec_queue.append({"id": ident, "command": command})
        self._wake.set()
        return ident

    def _exec_ended(self, ident: str, code: int) -> None:
        self.exec_done[ident] = code
        if self.exec_socket is not None and "-local-" in ident:
            self.exec_socket.done(ident, code)

    def _start_exec(self, request: dict[str, Any]) -> None:
        """A command mpirun's rsh agent on node 0 asked to run here (an orted), inside this
        node's job context: its environment and process tag, so teardown finds it."""
        dirs = node_dirs(self.plan)
        env = dict(self.base_env or node_env(self.plan, dirs))
        logs = self.paths.control / "exec"
        logs.mkdir(parents=True, exist_ok=True)
        ident = str(request["id"])
        cwd = dirs.workdir if dirs.workdir.is_dir() else Path("/")
        command = own_agent(str(request["command"]), self.plan.rsh_agent)
        # the sandbox's private /tmp and /dev/shm (node/mountview.py) are the node's own already
        private_tmp = self.sandbox is not None and self.sandbox.how() == "ns"
        own = {} if private_tmp else node_mca_env(self.plan, self._session_base)
        if own:
            self._session_base.mkdir(mode=0o700, exist_ok=True)
            if self.sandbox is not None:
                self.sandbox.give(self._session_base)
            env.update(own)
        argv, out, err = ["bash", "-c", command], logs / f"{ident}.stdout.txt", \
            logs / f"{ident}.stderr.txt"
        try:
            pid = None if self.box is not None or self.sandbox is None else \
                self.sandbox.spawn(argv, merged_environ(env), cwd, out, err)
            if pid is None:
                pid = self._spawn(argv, env, cwd, out, err, inside=True).pid
        except OSError as exc:
            self.say(f"relay exec {ident} failed to start: {exc}")
            self._exec_ended(ident, 127)
            self.write_status()
            return
        self.execs[pid] = ident
        self.ranks[-100 - pid] = {"rank": -100 - pid, "what": "exec", "pid": pid,
                                  "exit_code": None}
        self.say(f"relay exec {ident}: pid {pid}")


_AGENT_PATH = re.compile(r"/[^\s\"']*/\.batchyard/rsh-agent(?=[\s\"']|$)")


def own_agent(command: str, agent: list[str] | None) -> str:
    """An MPI daemon's command names node 0's relay agent (mpirun passes its own
    ``plm_rsh_agent``, Hydra its ``--launcher-exec``), a path that exists on node 0 only
    (in its container, on its disk): each node runs it with its own agent instead."""
    if not agent:
        return command
    return _AGENT_PATH.sub(lambda _: agent[0], command)
