"""The per-node agent of the Ray backend: a detached, named Ray actor (one per node of an
attempt) that runs the same node launcher as the local backend on its Ray node, relays the
server's control files there, and answers liveness pings.

This module imports nothing from Ray at import time: ``batchyard.backends.ray`` wraps
:class:`NodeAgent` with ``ray.remote`` when a Ray cluster is used."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from batchyard.node import proctree
from batchyard.node.plan import AttemptPaths, NodePlan, read_json, write_json_atomic

# Ray's own variables (the cluster token above all) never reach the launcher or user code.
_SCRUB = ("RAY_", "CUDA_VISIBLE_DEVICES")
NAMESPACE = "batchyard"
RSH_AGENT = "ray-rsh-agent"


def actor_name(attempt_uuid: str, node_rank: int) -> str:
    return f"batchyard-{attempt_uuid}-{node_rank}"


def scrubbed(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(_SCRUB)}


class NodeAgent:
    """Lives on one Ray node for one attempt; methods are called by the server."""

    def __init__(self, node_rank: int) -> None:
        self.node_rank = node_rank
        self.proc: subprocess.Popen[bytes] | None = None
        self.plan: NodePlan | None = None
        self.relay: Any = None

    def start(self, plan: dict[str, Any], gpu_ids: list[int] | None) -> dict[str, Any]:
        """Write the plan on this node and start the launcher; idempotent (a second call for
        a launcher that already started returns the first one's pid)."""
        from batchyard.backends.local import launcher_argv, launcher_env, proc_start_time

        node_plan = NodePlan(**plan)
        if gpu_ids:
            node_plan.gpus = gpu_ids
        paths = AttemptPaths(Path(node_plan.attempt_dir))
        paths.control.mkdir(parents=True, exist_ok=True)
        paths.stdouterr.mkdir(parents=True, exist_ok=True)
        Path(node_plan.node_dir).mkdir(parents=True, exist_ok=True)
        self.plan = node_plan
        if node_plan.rsh_agent and node_plan.rsh_agent[0].endswith(RSH_AGENT):
            from batchyard.backends import ray_rsh

            ray_rsh.write_agent(Path(node_plan.rsh_agent[0]), node_plan.attempt_uuid)
            if self.node_rank == 0 and self.relay is None:
                self.relay = ray_rsh.Relay(node_plan.attempt_uuid, self._rsh)
        plan_path = paths.plan(self.node_rank)
        if not plan_path.exists():
            node_plan.save(plan_path)
        status = read_json(paths.status(self.node_rank)) or {}
        if self.proc is not None or (paths.started(self.node_rank).exists() and status):
            pid = self.proc.pid if self.proc is not None else status.get("pid")
            return {"pid": pid, "start_time": status.get("start_time"), **self._where()}
        log_path = paths.stdouterr / f"{node_plan.node_name}-launcher.out"
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                launcher_argv(str(plan_path)), stdin=subprocess.DEVNULL, stdout=log,
                stderr=log, start_new_session=True, env=scrubbed(launcher_env()), cwd="/")
        return {"pid": self.proc.pid, "start_time": proc_start_time(self.proc.pid),
                **self._where()}

    def _rsh(self, host: str, argv: list[str], path: str) -> tuple[int, str, str]:
        """Node 0's relay: run the rsh agent of the node launcher on HOST's node, through
        HOST's actor, so the command runs there in that node's job context."""
        import sys

        import ray

        from batchyard.backends.local import launcher_env

        assert self.plan is not None
        plan = self.plan
        names, addrs = plan.node_names, plan.node_addrs
        rank = names.index(host) if host in names else addrs.index(host)
        target = ray.get_actor(actor_name(plan.attempt_uuid, rank), namespace=NAMESPACE)
        cmd = [sys.executable, "-S", "-m", "batchyard.node.rsh", "--attempt-dir",
               plan.attempt_dir, host, *argv]
        env = {**launcher_env(), "PATH": path}
        get: Any = ray.get
        code, out, err = get(target.exec.remote(cmd, "/", env, None))
        return int(code), str(out), str(err)

    @staticmethod
    def _where() -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": os.uname()[1]}

    def ping(self, attempt_dir: str) -> dict[str, Any]:
        """The node's status file as this node sees it, and whether its launcher lives."""
        status = read_json(AttemptPaths(Path(attempt_dir)).status(self.node_rank)) or {}
        alive = self.proc.poll() is None if self.proc is not None else bool(
            status.get("pid") and proctree.alive(int(status["pid"])))
        return {"status": status, "launcher_alive": alive}

    def control(self, attempt_dir: str, name: str, payload: dict[str, Any] | None) -> None:
        """Relay a control file (cancel.json, finish) to this node's copy of the attempt."""
        paths = AttemptPaths(Path(attempt_dir))
        target = paths.control / name
        if target.exists():
            return
        if payload is None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        else:
            write_json_atomic(target, payload)

    def kill_tree(self, tag: str) -> None:
        proctree.kill_everything(tag, grace=0.0)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def exec(self, argv: list[str], cwd: str, env: dict[str, str],
             timeout: float | None) -> tuple[int, str, str]:
        return run_here(argv, cwd, env, timeout)


def run_here(argv: list[str], cwd: str, env: dict[str, str],
             timeout: float | None) -> tuple[int, str, str]:
    """``exec`` on a Ray node (also used as a plain Ray task for nodes without an agent)."""
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
