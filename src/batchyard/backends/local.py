"""The embedded backend: virtual nodes on this machine. Each node is a directory, a slice of
the machine's GPUs and an address (127.0.0.1); a node's share of an attempt is a detached
``python -m batchyard.node`` process in its own session, so it outlives the server."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from batchyard.backends.base import NODE_TERMINAL, Gang, GangStatus, NodeInfo, NodeStatus
from batchyard.config import data_root
from batchyard.node import proctree
from batchyard.node.env import merged_environ, node_dirs, node_env, rank_env
from batchyard.node.plan import AttemptPaths, NodePlan, read_json, write_json_atomic


def host_gpus() -> list[int]:
    """GPU indices this machine has (via nvidia-smi when present; none otherwise)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [int(x) for x in visible.split(",") if x.strip().isdigit()]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [int(x) for x in out.split() if x.isdigit()]


def free_ports(count: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in socks:
            sock.close()
    return ports


def proc_start_time(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return float(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class LocalBackend:
    name = "local"

    def provision_node(self, cluster: str, workspace: str, index: int,
                       size: dict[str, Any]) -> NodeInfo:
        name = f"{cluster}-{index}"
        directory = data_root() / "clusters" / workspace / cluster / "nodes" / name
        directory.mkdir(parents=True, exist_ok=True)
        gpus_wanted = int(size.get("gpus", 0))
        have = host_gpus()
        gpus: list[int] = []
        if gpus_wanted and have:
            start = (index * gpus_wanted) % len(have)
            gpus = [have[(start + i) % len(have)] for i in range(min(gpus_wanted, len(have)))]
        resources = {
            "cpus": int(size.get("vcpus", 1)),
            "gpus": len(gpus),
            "gpu_ids": gpus,
            "declared_gpus": gpus_wanted,
            "memory_gb": size.get("memory_gb"),
            "family": size.get("family"),
            "infiniband": bool(size.get("infiniband")),
        }
        return NodeInfo(name, index, "127.0.0.1", str(directory), resources)

    def remove_node(self, node: NodeInfo) -> None:
        shutil.rmtree(Path(node.directory) / "jobs", ignore_errors=True)
        shutil.rmtree(Path(node.directory) / "setup", ignore_errors=True)

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

    def setup_files(self, node: NodeInfo) -> list[tuple[str, str]]:
        setup = Path(node.directory) / "setup"
        if not setup.is_dir():
            return []
        return [(f"{node.name}/setup/{p.name}", str(p)) for p in sorted(setup.iterdir())
                if p.is_file() and not p.name.endswith(".tmp")]

    def _plans(self, gang: Gang) -> list[NodePlan]:
        spec = gang.spec
        dist = dict(spec.get("distribution") or {})
        world = int(dist.get("process_count") or 0) or len(gang.nodes) * int(
            dist.get("processes_per_node") or 1)
        ports = free_ports(1 + (world if dist.get("type") == "tensorflow" else 0))
        limits = spec.get("limits") or {}
        attempt = AttemptPaths(Path(gang.attempt_dir))
        plans = []
        for rank, node in enumerate(gang.nodes):
            plans.append(NodePlan(
                job_id=gang.job_id, job_name=gang.job_name, workspace=gang.workspace,
                experiment=gang.experiment, attempt=gang.attempt, attempt_uuid=gang.attempt_uuid,
                node_rank=rank, node_names=[n.name for n in gang.nodes],
                node_addrs=[n.address for n in gang.nodes], distribution=dist,
                command=spec.get("command"), prepare=spec.get("prepare"),
                attempt_dir=gang.attempt_dir, node_dir=node.directory,
                checkpoint_dir=gang.checkpoint_dir, master_addr=gang.nodes[0].address,
                master_port=ports[0], task_ports=ports[1:], env=dict(spec.get("env") or {}),
                secrets=dict(spec.get("secrets") or {}), outputs=dict(spec.get("outputs") or {}),
                inputs=dict(spec.get("inputs") or {}), mounts=list(spec.get("mounts") or []),
                stdouterr_path_prefix=spec.get("stdouterr_path_prefix"),
                code_archive=gang.code_archive,
                python=(spec.get("environment") or {}).get("python"),
                gpus=list(node.resources.get("gpu_ids") or []) or None,
                cpus=int(node.resources.get("cpus") or 1),
                api_url=gang.api_url, api_token=gang.api_token,
                max_wall_clock=limits.get("max_wall_clock"),
                grace_period=float(limits.get("grace_period", 30.0)),
                rsh_agent=[str(attempt.control / "rsh-agent")],
                storage_sync=spec.get("storage_sync"),
            ))
        return plans

    def dry_run(self, gang: Gang) -> str:
        lines: list[str] = []
        masked = set((gang.spec.get("secrets") or {}).keys())
        for plan in self._plans(gang):
            plan.api_token = "***" if plan.api_token else None
            dirs = node_dirs(plan)
            base = node_env(plan, dirs)
            address = plan.node_addrs[plan.node_rank]
            lines.append(f"# node {plan.node_rank}: {plan.node_name} ({address})")
            lines.append(f"launcher: {sys.executable} -m batchyard.node <plan>")
            if plan.prepare:
                lines.append(f"prepare: {_show(plan.prepare)}")
            from batchyard.node.launcher import Launcher

            for local, argv in Launcher(plan).commands():
                env = rank_env(plan, base, local)
                rank = plan.node_rank * plan.processes_per_node + local
                lines.append(f"rank {rank} (local {local}): {shlex.join(argv)}")
                for key in sorted(env):
                    value = "***" if key in masked or key == "BATCHYARD_TOKEN" else env[key]
                    lines.append(f"    {key}={json.dumps(value)}")
            if not Launcher(plan).commands():
                lines.append("(no processes of its own: its ranks are started by node 0)")
            lines.append("")
        return "\n".join(lines)

    def launch(self, gang: Gang) -> dict[str, Any]:
        """Idempotent: a launcher refuses to start twice for the same node of an attempt, so a
        server that died mid-launch can simply launch again."""
        attempt = AttemptPaths(Path(gang.attempt_dir))
        attempt.control.mkdir(parents=True, exist_ok=True)
        attempt.stdouterr.mkdir(parents=True, exist_ok=True)
        launchers = []
        plans = self._plans(gang)
        for plan in plans:
            if not attempt.plan(plan.node_rank).exists():
                plan.save(attempt.plan(plan.node_rank))
        write_rsh_agent(attempt)
        for plan in plans:
            status = read_json(attempt.status(plan.node_rank))
            if attempt.started(plan.node_rank).exists() and status:
                launchers.append({"node_rank": plan.node_rank, "pid": status.get("pid"),
                                  "start_time": status.get("start_time")})
                continue
            pid, start_time = _ZYGOTE.spawn(
                str(attempt.plan(plan.node_rank)),
                str(attempt.stdouterr / f"{plan.node_name}-launcher.out"))
            launchers.append({"node_rank": plan.node_rank, "pid": pid,
                              "start_time": start_time})
        return {"backend": self.name, "attempt_dir": gang.attempt_dir, "launchers": launchers,
                "tags": [p.tag for p in plans], "launched_at": time.time()}

    def poll(self, handle: dict[str, Any]) -> GangStatus:
        _reap()
        attempt = AttemptPaths(Path(handle["attempt_dir"]))
        nodes = []
        for launcher in handle["launchers"]:
            rank = int(launcher["node_rank"])
            status = read_json(attempt.status(rank)) or {}
            state = status.get("state", "starting")
            if state not in NODE_TERMINAL and not self._launcher_alive(launcher, status):
                state = "lost"
                status["message"] = "node launcher died"
            nodes.append(NodeStatus(
                node_rank=rank, state=state, exit_code=status.get("exit_code"),
                message=status.get("message"), failed_rank=status.get("failed_rank"),
                stdouterr_dir=status.get("stdouterr_dir"), raw=status,
            ))
        return GangStatus(nodes)

    @staticmethod
    def _launcher_alive(launcher: dict[str, Any], status: dict[str, Any]) -> bool:
        pid = status.get("pid") or launcher.get("pid")
        if not pid or not proctree.alive(int(pid)):
            return False
        expected = status.get("start_time") or launcher.get("start_time")
        return expected is None or proc_start_time(int(pid)) == expected

    def cancel(self, handle: dict[str, Any], state: str, message: str, grace: float) -> None:
        attempt = AttemptPaths(Path(handle["attempt_dir"]))
        if not attempt.cancel.exists():
            write_json_atomic(attempt.cancel, {"state": state, "message": message,
                                               "grace": grace, "at": time.time()})
        status = self.poll(handle)
        for node in status.nodes:
            if node.state == "lost":
                self.sweep(handle, node.node_rank)

    def sweep(self, handle: dict[str, Any], node_rank: int) -> None:
        """Kill whatever a dead launcher left behind, found by its process tag."""
        tags = handle.get("tags") or []
        if node_rank < len(tags):
            proctree.kill_everything(tags[node_rank], grace=0.0)

    def finish(self, handle: dict[str, Any]) -> None:
        attempt = AttemptPaths(Path(handle["attempt_dir"]))
        attempt.finish.touch()

    def exec(self, node: NodeInfo, argv: list[str], timeout: float) -> tuple[int, str, str]:
        env = merged_environ({"BATCHYARD_NODE_NAME": node.name,
                              "BATCHYARD_NODE_DIR": node.directory})
        try:
            proc = subprocess.run(argv, cwd=node.directory, env=env, capture_output=True,
                                  text=True, timeout=timeout, start_new_session=True)
        except FileNotFoundError as exc:
            return 127, "", f"{exc}\n"
        except subprocess.TimeoutExpired as exc:
            return 124, _text(exc.stdout), _text(exc.stderr) + f"\ntimed out after {timeout}s\n"
        return proc.returncode, proc.stdout, proc.stderr


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

    def spawn(self, plan_path: str, log_path: str) -> tuple[int, float | None]:
        with self._lock:
            try:
                proc = self._ensure()
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{plan_path}\t{log_path}\n")
                proc.stdin.flush()
                reply = proc.stdout.readline().split("\t")
                pid = int(reply[0])
                return pid, float(reply[1]) if reply[1].strip() != "None" else None
            except (OSError, ValueError, IndexError, AssertionError):
                self._proc = None
        with open(log_path, "ab") as log:
            child = subprocess.Popen(launcher_argv(plan_path), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, start_new_session=True,
                                     env=launcher_env(), cwd="/")
        _CHILDREN.append(child)
        return child.pid, proc_start_time(child.pid)


_ZYGOTE = Zygote()


def prestart() -> None:
    """Start the zygote ahead of the first job (called when the server starts)."""
    _ZYGOTE.start()
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def write_rsh_agent(attempt: AttemptPaths) -> None:
    """The agent mpirun calls instead of ssh, as one executable file (Open MPI splits the
    agent setting on spaces) that starts Python without site-packages, like the launcher."""
    path = attempt.control / "rsh-agent"
    if path.exists():
        return
    path.write_text(
        f"#!{sys.executable} -S\n"
        "import sys\n"
        f"sys.path.insert(0, {_PACKAGE_ROOT!r})\n"
        "from batchyard.node.rsh import main\n"
        f"sys.exit(main(['--attempt-dir', {str(attempt.root)!r}, *sys.argv[1:]]))\n"
    )
    path.chmod(0o755)


def launcher_argv(plan_path: str) -> list[str]:
    """``-S`` skips site-packages (and their .pth files): the launcher needs only the standard
    library and batchyard, and starts in a third of the time."""
    return [sys.executable, "-S", "-m", "batchyard.node", plan_path]


def launcher_env() -> dict[str, str]:
    env = merged_environ({})
    user = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + user if user else "")
    env["BATCHYARD_LAUNCHER"] = "1"
    if user:
        env["BATCHYARD_USER_PYTHONPATH"] = user
    return env


def _reap() -> None:
    """The server is the launchers' parent while it lives: reap them so none lingers as a
    zombie (a zombie still looks alive to a pid check)."""
    for proc in list(_CHILDREN):
        if proc.poll() is not None:
            _CHILDREN.remove(proc)


def _show(command: str | list[str]) -> str:
    return command if isinstance(command, str) else shlex.join(command)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
