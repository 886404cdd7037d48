"""Runs one node's share of one attempt: directories, code, preparation, ranks, limits,
teardown, outputs. Everything the server learns about it goes over the node channel (state
reports, log chunks, outputs); cancel, abort, finish and the MPI relay's exec requests come
back the same way. It leaves no process behind whatever way it ends."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from batchyard.launchplan import PORT_FROM_RENDEZVOUS, Ticket
from batchyard.node import event_sync, failure, jobview, netif, notice, proctree, spool_replay
from batchyard.node.boxed import Boxed
from batchyard.node.channel import Channel
from batchyard.node.env import (
    NodeDirs,
    expand_plan_paths,
    merged_environ,
    node_dirs,
    node_env,
    rank_env,
    tf_role_of,
)
from batchyard.node.gpu_usage import host_indices
from batchyard.node.limits import Limits, PathRefused
from batchyard.node.plan import AttemptPaths, NodePlan, open_append, read_json, write_json_atomic
from batchyard.node.preflight import Preflight
from batchyard.node.relay_execs import RelayExecs
from batchyard.node.sandbox import Sandbox, protect_process
from batchyard.node.session import Sessions, keep_alive
from batchyard.node.staging import Staging
from batchyard.node.usage import Sampler
from batchyard.node.watchdog import HangWatch
from batchyard.states import LAUNCHER_FINAL

POLL = 0.05
FAIL_FAST_GRACE = 3.0
EXEC_SETTLE = 5.0  # seconds a node's MPI daemons get to end after its ranks succeeded
TERMINAL = set(LAUNCHER_FINAL)
START_DEADLINE = 600.0  # how long a node waits for the server, its plan and its gang
DRAIN_DEADLINE = 24 * 3600.0  # how long the final logs and report are retried


class Launcher(RelayExecs, Staging, Limits, Boxed, HangWatch):
    def __init__(self, plan: NodePlan, channel: Channel | None = None,
                 ticket_file: str | None = None) -> None:
        expand_plan_paths(plan)
        self.plan = plan
        self.channel = channel
        self.ticket_file = ticket_file
        self.base_env: dict[str, str] = {}
        self.execs: dict[int, str] = {}  # pid -> relay exec id
        self.exec_done: dict[str, int] = {}
        self._exec_queue: list[dict[str, Any]] = []
        # set when the channel brings work for the main loop (a relay exec): it waits on this
        # instead of sleeping, so an orted starts at once rather than within POLL
        self._wake = threading.Event()
        self._exec_seen: set[str] = set()
        self._exec_lock = threading.Lock()
        self._local_execs = 0
        self.sessions = Sessions(self)  # job exec (node/session.py)
        self.paths = AttemptPaths(Path(plan.attempt_dir))
        self.started = time.time()
        self.deadline = (
            self.started + plan.max_wall_clock if plan.max_wall_clock is not None else None
        )
        self.status: dict[str, Any] = {
            "node_rank": plan.node_rank,
            "node": plan.node_name,
            "pid": os.getpid(),
            "start_time": proctree.start_time(os.getpid()),
            "state": "preparing",
            "ranks": [],
            "started_at": self.started,
        }
        self.ranks: dict[int, dict[str, Any]] = {}
        # Popen objects must outlive their processes: a collected Popen reaps its child in
        # __del__, stealing the exit status from the waitpid(-1) loop below.
        self.children: list[subprocess.Popen[bytes]] = []
        self.log: TextIO = sys.stderr
        self.stop_signal: int | None = None
        # Every Popen stays referenced until the launcher ends: a collected Popen whose child
        # already exited reaps it in __del__, and its exit code would never reach reap_children.
        self._popens: list[subprocess.Popen[bytes]] = []
        self._status_lock = threading.Lock()  # the usage sampler writes the status file too
        self.oom = failure.OomWatch()
        self.preflight: Preflight | None = None  # job/cluster preflight (node/preflight.py)
        self.preflight_verdict: dict[str, Any] | None = None
        self.gang_saved = False  # a checkpoint saved in the notice, on any node (server)
        self.sandbox: Sandbox | None = None  # the rank sandbox (node/sandbox.py)
        self.logs_fd: int | None = None  # stdouterr, held from before any job process ran
        self.relay: Any = None  # the rsh agent's local relay (node/relaysock.py)
        self.exec_socket: Any = None  # relay execs from launchers on this machine (same)

    def write_status(self, **changes: Any) -> None:
        with self._status_lock:
            self.status.update(changes)
            self.status["updated_at"] = time.time()
            self.status["ranks"] = list(self.ranks.values())
            self.status["execs"] = dict(self.exec_done)
            write_json_atomic(self.paths.status(self.plan.node_rank), self.status)
            if self.channel is not None:
                self.channel.report(self.status)

    def _with_lag(self, changes: dict[str, Any]) -> dict[str, Any]:
        """The sample's summary for /metrics gets how far log shipping lags."""
        if self.channel is not None and isinstance(changes.get("scrape"), dict):
            changes["scrape"]["lag"] = self.channel.log_lag()
        return changes

    def say(self, message: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} [{self.plan.node_name}] {message}\n")
        self.log.flush()

    def run(self) -> int:
        plan = self.plan
        marker = self.paths.started(plan.node_rank)
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return 0  # another launcher already owns this node's share: never run twice
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        subreaper = proctree.become_subreaper()
        protect_process()  # no rank reads this process's memory, fds or environment
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if self.channel is not None:
            self.channel.on_control = self._on_control
            self.channel.start()
        self.write_status()
        state: str = "failed"
        extra: dict[str, Any] = {}
        # CPU/memory/GPU samples every ~2 s into the status file (the portal, /metrics), the
        # job's GPU record (job show) and how far log shipping lags
        sampler = Sampler(lambda: {int(p) for p in self._groups()},
                          lambda changes: self.write_status(**self._with_lag(changes)),
                          gpus=host_indices(plan.gpus), observe=plan.observe).start()
        try:
            dirs = node_dirs(plan)
            self._mount_links(dirs)
            refused = jobview.refused(plan, dirs)  # (before anything is made there)
            if refused is not None:
                raise PathRefused(refused)
            self._make_dirs(dirs)
            self.logs_fd = os.open(dirs.stdouterr, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self.log = os.fdopen(open_append(
                dirs.stdouterr / f"{plan.node_name}-launcher.txt", self.logs_fd), "a")
            if self.channel is not None:
                self.channel.ship_logs(dirs.stdouterr)
            notice.prepare(self.logs_fd, plan.node_name)
            self.write_status(stdouterr_dir=str(dirs.stdouterr))
            self._meet_gang()
            state, extra = self._preflight()
            base_env = node_env(plan, dirs)
            self._prepare_python(dirs, base_env)
            self.base_env = base_env
            if not self.boxed:  # a container is the job's sandbox (node/boxed.py)
                self.sandbox = Sandbox(plan, dirs, self.say)
                self.sandbox.how()
                if self.relay is not None and subreaper:
                    # the relay's execs (MPI daemons) in one fork each: the ranks wait for
                    # them (node/spawner.py)
                    self.sandbox.start_spawner()
            if state == "ready":
                state, extra = self._stage_in(dirs)
            if state == "ready":
                state, extra = self._prepare(dirs, base_env)
            if state == "ready":
                sync = self._start_sync()
                events = event_sync.start(self.channel, plan, dirs.outputs)  # TensorBoard
                state, extra = self._run_ranks(dirs, base_env)
                events.stop()
                state, extra = self._stage_out(state, extra, sync)
            state, extra = self._upload_outputs(dirs, state, extra)
            spool_replay.replay_for(self)  # metrics ranks spooled while the server was away
            state, extra = self._flush_mounts(state, extra)
        except PathRefused as exc:
            self.say(f"refused: {exc}")
            state, extra = "failed", {"message": f"on node {plan.node_name}: {exc}",
                                      "error": failure.record(
                                          failure.PREPARATION, node=plan.node_name,
                                          node_rank=plan.node_rank, summary=str(exc),
                                          what="paths")}
        except Exception as exc:  # the launcher's own failure must still end in a true state
            import traceback

            self.say("launcher error:\n" + traceback.format_exc())
            state, extra = "failed", {"message": f"node launcher error on {plan.node_name}: {exc}"}
        finally:
            sampler.stop()
            left = proctree.kill_everything(plan.tag, self._groups(), grace=0.0, reap=True)
            if left:
                self.say(f"killed {left} leftover process(es)")
            keep_alive(self, state, extra)  # limits.keep_alive_on_failure: for job exec
            self.stop_box()
            state, extra = self._unmount_all(state, extra)  # FUSE and NFS (node/staging.py)
            shutil.rmtree(self._session_base, ignore_errors=True)
            if plan.dist_type == "mpi" and plan.node_rank == 0 and state != "succeeded":
                from batchyard.node.mpi import label_mpirun_teardown

                label_mpirun_teardown(
                    node_dirs(plan).stdouterr / f"{plan.node_name}-mpirun.stderr.txt",
                    self.paths.abort, plan.node_rank, extra.get("message"))
            if self.relay is not None:
                self.relay.close()
            if self.exec_socket is not None:
                self.exec_socket.close()
            if self.sandbox is not None:
                self.sandbox.close()  # last: the job's PID namespace, with what is left in it
        self.say(f"finished: {state} {extra.get('message', '')}".rstrip())
        error = failure.node_error(state, extra, plan.node_name, plan.node_rank,
                                   bool(self.status.get("running_at")))
        extra = {**extra, "error": error} if error else extra
        self.write_status(state=state, ended_at=time.time(), **extra)
        if self.channel is not None and not self.channel.close(time.time() + DRAIN_DEADLINE):
            self.say("gave up sending the final logs and report to the server")
        return 0

    # --- the node channel -------------------------------------------------------------------

    def _meet_gang(self) -> None:
        """Ports are chosen here, on this node (free here, not on the server's host), and
        published through the server; every node waits for the whole gang before starting.
        This node's interface is found here too, for gloo, NCCL and Open MPI."""
        plan = self.plan
        slurm_gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "") if os.environ.get(
            "SLURM_JOB_ID") else ""
        if plan.gpus is None and slurm_gpus:  # the GPUs Slurm gave this job on this node
            plan.gpus = [int(g) if g.isdigit() else g for g in
                         (x.strip() for x in slurm_gpus.split(",")) if g] or None
        plan.ifname = netif.interface_of(plan.node_addrs[plan.node_rank])
        plan.subnet = netif.subnet_of(plan.ifname) if plan.ifname not in (None, "lo") else None
        if self.channel is not None and plan.master_port == PORT_FROM_RENDEZVOUS:
            self.preflight = Preflight.of(plan, self.say)
            mine = netif.free_ports(plan.ports_wanted()) + (
                self.preflight.ports() if self.preflight else [])  # its listener's, last
            everyone = self.channel.rendezvous(mine, time.time() + START_DEADLINE)
            if self.preflight:
                self.preflight.meet(everyone)
            plan.master_port = int(everyone[0][0])
            if plan.dist_type == "tensorflow":
                ppn = plan.processes_per_node
                plan.task_ports = [int(everyone[r // ppn][1 + r % ppn])
                                   for r in range(plan.world_size)]
        elif plan.master_port == PORT_FROM_RENDEZVOUS:  # no server (unit tests): this host
            ports = netif.free_ports(1 + plan.world_size)
            plan.master_port, plan.task_ports = ports[0], ports[1:]
        if self.channel is not None and plan.dist_type in ("mpi", "custom"):
            from batchyard.node.relaysock import ExecSocket, RelaySocket, exec_socket_path

            try:  # the shortcut for launchers of this attempt on this machine
                self.exec_socket = ExecSocket(
                    exec_socket_path(plan.attempt_uuid, plan.node_rank), self._submit_exec,
                    self.say)
            except OSError as exc:
                self.say(f"no exec socket ({exc}): relay execs come through the server only")

            def peer(host: str) -> str | None:
                for rank, (name, addr) in enumerate(zip(plan.node_names, plan.node_addrs,
                                                        strict=False)):
                    if host in (name, addr):  # (the server's choice too: the first)
                        return exec_socket_path(plan.attempt_uuid, rank)
                return None

            self.relay = RelaySocket(self.paths.control / "rsh.sock", self.channel, self.say,
                                     peer)
            plan.rsh_agent = [str(write_rsh_agent(self.paths, self.relay.path,
                                                  inside=self.boxed))]
        plan.save(self.paths.plan(plan.node_rank), mask_registry=True)

    def _preflight(self) -> tuple[str, dict[str, Any]]:
        """The gang's pre-flight checks, when the job or its cluster asks for them: measured
        here, judged by the server (which may place the gang again without this node)."""
        if self.preflight is None:
            return "ready", {}
        self.write_status(preflight=self.preflight.measure())
        return self.preflight.await_verdict(lambda: self.preflight_verdict, self._stop_reason,
                                            self._pause)

    @property
    def _session_base(self) -> Path:
        """This node's Open MPI session-dir base on a machine shared with other nodes."""
        return Path("/tmp") / f"by-ompi-{self.plan.attempt_uuid[:8]}-{self.plan.node_rank}"

    def _pause(self) -> None:
        self._wake.wait(POLL)
        self._wake.clear()

    def _on_control(self, control: dict[str, Any]) -> None:
        """Runs on the channel's thread: turn what the server says into the node-local
        markers the launcher's loops already watch."""
        if control.get("cancel") and not self.paths.cancel.exists():
            write_json_atomic(self.paths.cancel, control["cancel"])
        abort = control.get("abort")
        if abort and abort.get("node_rank") != self.plan.node_rank \
                and not self.paths.abort.exists():
            write_json_atomic(self.paths.abort, abort)
        if control.get("finish") and not self.paths.finish.exists():
            self.paths.finish.parent.mkdir(parents=True, exist_ok=True)
            self.paths.finish.touch()
        self.sessions.control(control)
        if control.get("checkpointed"):  # saved on another node: the notice is over
            self.gang_saved = True
        if control.get("preflight"):  # the server's verdict on the gang's pre-flight
            self.preflight_verdict = control["preflight"]
            self._wake.set()
        if control.get("stacks"):  # job stacks, the hang watchdog (node/stacks.py)
            self.stacks_requested(control["stacks"])
        for request in (control.get("execs") or {}).get(str(self.plan.node_rank), []):
            with self._exec_lock:
                if request["id"] not in self._exec_seen:
                    self._exec_seen.add(request["id"])
                    self._exec_queue.append(request)
                    self._wake.set()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """SIGTERM/SIGINT: the ranks stop with the grace period (``_stop_reason``), and the
        channel gives up waiting for a server that may be gone: what is unsent stays in the
        spool on this node's disk, and the launcher exits."""
        self.stop_signal = signum
        if self.channel is not None:
            self.channel.abandon.set()

    def _mount_links(self, dirs: NodeDirs) -> None:
        """Mounts first: stdouterr and output paths often live under a mount
        ($AZ_BATCHAI_JOB_MOUNT_ROOT/logs), and must land in the mounted storage (and be
        checked where they land, jobview.refused)."""
        dirs.job_mount_root.mkdir(parents=True, exist_ok=True)
        for mount in self.plan.mounts:
            target = dirs.job_mount_root / mount["relative_path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            if mount.get("kind") == "local":
                if not target.exists() and not target.is_symlink():
                    target.symlink_to(mount["source"], target_is_directory=True)
            elif mount.get("mount_command") or mount.get("store"):
                target.mkdir(parents=True, exist_ok=True)

    def _make_dirs(self, dirs: NodeDirs) -> None:
        for path in (dirs.mount_root, dirs.job_temp, dirs.shared_job_temp,
                     dirs.workdir, dirs.stdouterr, Path(self.plan.checkpoint_dir),
                     *dirs.outputs.values()):
            path.mkdir(parents=True, exist_ok=True)
        if self.plan.code_archive:
            import tarfile

            archive = Path(self.plan.code_archive)
            if self.channel is not None and not archive.is_absolute():
                archive = self.channel.fetch_code(
                    self.plan.code_archive, Path(self.plan.node_dir) / "cache" / "snapshots",
                    time.time() + START_DEADLINE)
            with tarfile.open(archive) as tar:
                tar.extractall(dirs.workdir, filter="data")
        if self.plan.dist_type in ("mpi", "custom"):
            # on every node: each rank is told $AZ_BATCHAI_MPI_HOST_FILE, and nodes share no disk;
            # in the format of the job's MPI flavour (else its mpirun's: node/mpi.py)
            from batchyard.node.mpi import hostfile_lines, resolve_flavour

            flavour = resolve_flavour(self.plan, detect=not self.boxed)
            lines = [f"{line}\n" for line in hostfile_lines(self.plan, flavour)]
            dirs.hostfile.write_text("".join(lines))

    def _prepare_python(self, dirs: NodeDirs, env: dict[str, str]) -> None:
        """`python`, `python3` and `pip` in commands mean the job's interpreter:
        environment.python if given, else the interpreter batchyard itself runs on (shims
        first on PATH, then its own bin directory: a virtualenv's tools)."""
        if self.boxed:
            return  # the image's own python and PATH (start_box shims environment.python)
        from batchyard.node.env import job_python_env

        target = Path(self.plan.python or sys.executable)
        env.update(job_python_env(self.plan, dirs, target,
                                  os.environ.get("PATH", "/usr/bin:/bin")))

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: Path, out: Path,
               err: Path, inside: bool = False,
               stdin_data: bytes | None = None) -> subprocess.Popen[bytes]:
        """``inside``: a job process, run in the node's container when the job has one.
        ``stdin_data``: written to its stdin (a helper's plan with its secrets: never a
        file)."""
        if inside and self.box is not None:
            argv = self.boxed_argv(argv, env, cwd)
        elif inside and self.sandbox is not None:
            argv = self.sandbox.wrap(argv)
        with self.append(out) as stdout, self.append(err) as stderr:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=merged_environ(env),
                stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                stdout=stdout, stderr=stderr, start_new_session=True,
                preexec_fn=proctree.die_with_parent,
            )
        self._popens.append(proc)
        if stdin_data is not None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(stdin_data)
            proc.stdin.close()
        return proc

    def job_uid(self) -> int | None:
        return self.sandbox.uid if self.sandbox is not None else None

    def _give(self, path: Path) -> None:
        if self.sandbox is not None and path.is_dir():
            self.sandbox.give(path)

    def append(self, path: Path) -> Any:
        """A log file opened for appending, never through a link a job planted (the log
        folder's own descriptor, held from before any job process ran)."""
        held = self.logs_fd if path.parent == node_dirs(self.plan).stdouterr else None
        return os.fdopen(open_append(path, held), "ab")

    def _prepare(self, dirs: NodeDirs, env: dict[str, str]) -> tuple[str, dict[str, Any]]:
        plan = self.plan
        for mount in plan.mounts:
            if mount.get("kind") == "unmanaged" and mount.get("mount_command"):
                target = dirs.job_mount_root / mount["relative_path"]
                cmd = f"{mount['mount_command']} {target}"
                state, extra = self._run_step("mount", ["bash", "-c", cmd], dirs, env)
                if state != "ready":
                    extra["message"] = f"mounting {mount['relative_path']} failed: " + extra[
                        "message"]
                    return state, extra
        if self.boxed:
            state, extra = self.start_box(dirs, env)
            if state != "ready":
                return state, extra
        if plan.prepare is None:
            return "ready", {}
        argv = _argv(plan.prepare)
        self.say(f"job preparation: {argv}")
        return self._run_step("prepare", argv, dirs, env, inside=True)

    def _run_step(self, what: str, argv: list[str], dirs: NodeDirs,
                  env: dict[str, str], inside: bool = False) -> tuple[str, dict[str, Any]]:
        name = self.plan.node_name
        proc = self._spawn(argv, env, dirs.workdir,
                           dirs.stdouterr / f"{name}-{what}.stdout.txt",
                           dirs.stdouterr / f"{name}-{what}.stderr.txt", inside=inside)
        self.ranks[-1] = {"rank": -1, "what": what, "pid": proc.pid, "exit_code": None}
        while True:
            stop = self._stop_reason()
            if stop:
                return self._stop(stop)
            for pid, status in self._reap():
                if pid == proc.pid:
                    code = proctree.exit_code(status)
                    proc.returncode = code
                    del self.ranks[-1]
                    over = self._over_limit(dirs, now=True)  # (a fork it was refused)
                    if over is not None:
                        return over
                    if code != 0:
                        error = failure.record(
                            failure.PREPARATION, node=name, node_rank=self.plan.node_rank,
                            exit_code=code, what=what, lines=failure.read_tail(
                                dirs.stdouterr / f"{name}-{what}.stderr.txt"))
                        return "failed", {"exit_code": code, "error": error, "message":
                                          f"job {what} on node {name} exited with code {code}"}
                    return "ready", {}
            over = self._over_limit(dirs)
            if over is not None:
                return over
            self._pause()

    def commands(self) -> list[tuple[int, list[str]]]:
        """(local rank, argv) for the processes this node starts itself."""
        plan = self.plan
        kind = plan.dist_type
        if kind in ("custom", "mpi"):
            if plan.node_rank != 0:
                return []
            if kind == "mpi":
                from batchyard.node.mpi import mpirun_argv

                return [(0, mpirun_argv(plan))]
            return [(0, _argv(plan.command))]
        out = []
        roles = plan.distribution.get("role_commands") or {}
        for local in range(plan.processes_per_node):
            if plan.node_rank * plan.processes_per_node + local >= plan.world_size:
                break
            command = plan.command
            if kind == "tensorflow" and roles:
                command = roles.get(tf_role_of(plan, local), plan.command)
            if command is None:
                raise RuntimeError("no command for this task")
            out.append((local, _argv(command)))
        return out

    def _run_ranks(self, dirs: NodeDirs, base: dict[str, str]) -> tuple[str, dict[str, Any]]:
        plan = self.plan
        procs: dict[int, int] = {}
        settle = 0.0
        for local, argv in self.commands():
            rank = plan.node_rank * plan.processes_per_node + local
            if plan.dist_type == "mpi":
                env, label = dict(base), "mpirun"
            else:
                env, label = rank_env(plan, base, local), f"rank{rank}"
            proc = self._spawn(argv, env, dirs.workdir,
                               dirs.stdouterr / f"{plan.node_name}-{label}.stdout.txt",
                               dirs.stdouterr / f"{plan.node_name}-{label}.stderr.txt",
                               inside=True)
            procs[proc.pid] = rank
            self.ranks[rank] = {"rank": rank, "local_rank": local, "pid": proc.pid,
                                "exit_code": None}
        self.write_status(state="running", running_at=time.time())
        self.say(f"started {len(procs)} rank(s)")
        self.start_watch(dirs.stdouterr)  # limits.hang_timeout (node/watchdog.py)
        self.oom.look(list(procs), force=True)
        while True:
            for pid, status in self._reap():
                found = procs.get(pid)
                if found is None:
                    continue
                rank = found
                code = proctree.exit_code(status)
                self.ranks[rank]["exit_code"] = code
                self.say(f"rank {rank} exited with code {code}")
                over = self._over_limit(dirs, now=True) if code != 0 else None
                if over is not None:  # (it ended as a fork was refused: that is why)
                    return over
                if code != 0:
                    return self._fail(rank, code, pid)
                self.write_status()
            if procs and all(self.ranks[r]["exit_code"] == 0 for r in procs.values()):
                # mpirun can exit while this node's own MPI daemon still tidies up: give
                # the relay's execs a moment to end by themselves rather than kill them
                settle = settle or time.time() + EXEC_SETTLE
                if not self.execs or time.time() >= settle:
                    return self._over_limit(dirs, now=True) or ("succeeded", {"exit_code": 0})
            stop = self._stop_reason()
            if stop:
                return self._stop(stop)
            self._look_checkpoint()
            if not procs and self.paths.finish.exists():
                return "succeeded", {"exit_code": 0}
            if plan.dist_type == "mpi":
                culprit = self._mpi_failure()
                if culprit is not None:  # fail fast: Hydra lets the other ranks run on
                    return self._fail(culprit[0], culprit[1])
            over = self._over_limit(dirs)
            if over is not None:
                return over
            lost = [r for pid, r in procs.items() if self.ranks[r]["exit_code"] is None
                    and not os.path.exists(f"/proc/{pid}")]
            if lost:  # gone without an exit status reaching us: never wait on it forever
                return self._fail(lost[0], -1)
            self.oom.look([p for p, r in procs.items() if self.ranks[r]["exit_code"] is None])
            self.watch_tick()
            self._pause()

    _mpi_checked = 0.0

    def _mpi_failure(self) -> tuple[int, int, str] | None:
        """MPI ranks leave their exit codes on their node's disk: the first failure is
        reported (so the job names the rank rather than just mpirun) and ends this node's
        share, and so the gang, at once. Open MPI's mpirun would end the job itself; Hydra
        lets the other ranks run on after one exits non-zero past MPI_Finalize."""
        if time.time() - self._mpi_checked < 0.2:
            return None
        self._mpi_checked = time.time()
        from batchyard.node.mpi import failed_rank

        culprit = failed_rank(self.plan.attempt_dir)
        if culprit:
            self.write_status(mpi_failed=list(culprit), mpi_failed_at=time.time())
        return culprit

    def _fail(self, rank: int, code: int, pid: int = 0) -> tuple[str, dict[str, Any]]:
        name, at = self.plan.node_name, time.time()
        label = "mpirun" if self.plan.dist_type == "mpi" else f"rank{rank}"
        message = f"rank {rank} on node {name} exited with code {code}"
        if self.plan.dist_type == "mpi":
            from batchyard.node.mpi import failed_rank

            culprit = failed_rank(self.plan.attempt_dir)
            if culprit:
                rank, code, name = culprit
                message = f"MPI rank {rank} on node {name} exited with code {code}"
            else:
                message = f"mpirun on node {name} exited with code {code}"
        logs = self._rank_logs(name, rank) + self._rank_logs(self.plan.node_name, label)
        error = failure.rank_error(rank, code, name, self.plan.node_rank, logs,
                                   self.oom.killed(pid, code), at)
        message = failure.message_of(error, message)
        if not self.paths.abort.exists():
            write_json_atomic(self.paths.abort, {"node": name, "node_rank": self.plan.node_rank,
                                                 "rank": rank, "exit_code": code,
                                                 "message": message})
        proctree.kill_everything(self.plan.tag, self._groups(),
                                 grace=min(FAIL_FAST_GRACE, self.plan.grace_period), reap=True)
        return "failed", {"exit_code": code, "failed_rank": rank, "message": message,
                          "error": error}

    def _rank_logs(self, node: str, rank: int | str) -> list[Path]:
        label = rank if isinstance(rank, str) else f"rank{rank}"
        stdouterr = node_dirs(self.plan).stdouterr
        return [stdouterr / f"{node}-{label}.stderr.txt", stdouterr / f"{node}-{label}.stdout.txt"]

    def _stop_reason(self) -> dict[str, Any] | None:
        if self.stop_signal is not None:
            return {"state": "canceled", "message": f"launcher got signal {self.stop_signal}",
                    "grace": self.plan.grace_period}
        cancel = read_json(self.paths.cancel)
        if cancel:
            return {"state": cancel.get("state", "canceled"),
                    "message": cancel.get("message", "terminated"),
                    "grace": float(cancel.get("grace", self.plan.grace_period)),
                    "notice": float(cancel.get("notice") or 0.0)}
        abort = read_json(self.paths.abort)
        if abort and abort.get("node_rank") != self.plan.node_rank:
            return {"state": "aborted", "message": abort.get("message", "gang aborted"),
                    "grace": min(FAIL_FAST_GRACE, self.plan.grace_period)}
        if self.deadline is not None and time.time() >= self.deadline:
            return {"state": "timeout", "grace": self.plan.grace_period,
                    "message": f"exceeded max wall clock time of {self.plan.max_wall_clock:g}s"}
        return None

    def _stop(self, stop: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.say(f"stopping ({stop['state']}): {stop['message']}; grace {stop['grace']:g}s")
        self.write_status(state="stopping")
        running = [r["pid"] for r in self.ranks.values()
                   if r.get("pid") and r.get("exit_code") is None and r["rank"] >= 0]
        if stop.get("notice") and running and self.logs_fd is not None:
            notice.give(self.logs_fd, self.plan.node_name, self.plan.checkpoint_signal,
                        self.plan.tag, stop["notice"], stop["message"],
                        lambda: not self.gang_saved and any(proctree.alive(p) for p in running),
                        self.say)
            self._look_checkpoint()
        self.write_status(sigterm_at=time.time())
        proctree.kill_everything(self.plan.tag, self._groups(), grace=stop["grace"], reap=True)
        if stop["state"] == "timeout":
            return "timeout", {"message": stop["message"], "error": failure.record(
                failure.WALL_CLOCK, node=self.plan.node_name, node_rank=self.plan.node_rank,
                summary=stop["message"], what="node")}
        return stop["state"], {"message": stop["message"]}

    def _look_checkpoint(self) -> None:
        """A checkpoint a rank reported (node/notice.py) goes to the server with the status:
        victims are chosen by the work done since, and a preemption says what it lost."""
        if self.logs_fd is None:
            return
        saved = notice.last_mark(self.logs_fd, self.plan.node_name)
        if saved is not None and saved != self.status.get("checkpoint"):
            self.write_status(checkpoint=saved)

    def _groups(self) -> list[int]:
        return [r["pid"] for r in self.ranks.values() if r.get("pid")]


def _argv(command: str | list[str] | None) -> list[str]:
    if command is None:
        raise RuntimeError("no command")
    if isinstance(command, list):
        return [str(c) for c in command]
    return ["bash", "-c", command]


def from_ticket(ticket_file: str) -> Launcher:
    """Everything a node needs comes over the API: the ticket says only where the server is
    and how to authenticate; the plan (secrets included) is fetched from it."""
    channel = Channel(Ticket.load(Path(ticket_file)))
    return with_plan(ticket_file, channel, channel.fetch_plan(time.time() + START_DEADLINE))


def with_plan(ticket_file: str, channel: Channel, data: dict[str, Any]) -> Launcher:
    """The launcher of a plan fetched over ``channel`` (node/slurm.py fetches it while this
    module is still being imported)."""
    plan = NodePlan.from_dict(data)
    plan.api_url = channel.ticket.server  # the address this node reaches the server at
    plan.ca_file = channel.ticket.ca_file
    return Launcher(plan, channel, ticket_file)


def write_rsh_agent(paths: AttemptPaths, socket_path: Path, inside: bool = False) -> Path:
    """The agent mpirun calls instead of ssh, as one executable file (Open MPI splits the
    agent setting on spaces). mpirun starts one per node and the ranks wait for it, so it
    starts Python isolated and without site-packages (``-I -S``) and imports ``node/rsh.py``
    alone (not the ``batchyard`` package). It holds no credential (a rank can read it): it
    hands the request to this launcher over a Unix socket in the attempt's control dir
    (node/relaysock.py), and the launcher relays it over the node channel. In a container it
    runs on the image's ``python3`` (node/rsh.py is mounted read-only at the same path),
    started by a two-line shell script as no interpreter path can be known."""
    from batchyard.node import rsh

    node_dir = Path(rsh.__file__).resolve().parent
    path = paths.control / "rsh-agent"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = (
        "import sys\n"
        f"sys.path += [{str(node_dir)!r}]\n"
        "from rsh import local\n"
        f"sys.exit(local({str(socket_path)!r}, sys.argv[1:]))\n"
    )
    if inside:
        _write_script(path.with_name("rsh-agent.py"), body)
        script = f'#!/bin/sh\nexec python3 -I -S {shlex.quote(str(path) + ".py")} "$@"\n'
    else:
        script = f"#!{sys.executable} -IS\n" + body
    _write_script(path, script)
    return path


def _write_script(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m batchyard.node TICKET.json", file=sys.stderr)
        return 2
    # the threads here wait on I/O, and the log shipper's wake-up must not queue for the GIL
    # behind the usage sampler's /proc walk for the default 5 ms at each of its syscalls
    sys.setswitchinterval(0.0005)
    return from_ticket(args[0]).run()
