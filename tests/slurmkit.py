"""A real Slurm cluster for tests: slurmctld on a ``login`` host, one slurmd per node host.

Built on tests/hostkit.py: every host is a network + UTS + mount namespace with its own address,
hostname and private tmpfs work dir (``WORK_DIR``), so a job's processes really run "elsewhere":
slurmd forks them inside its host, and what they write under ``WORK_DIR`` (e.g. ``--output``,
which the batch host, the job's first node, opens) is read back with ``Host.read_file``. Paths
outside ``WORK_DIR`` are shared by all hosts (the temp dir ``root``, the repo, its venv).

Nothing here touches the system's Slurm or MUNGE: slurm.conf, gres.conf, state, logs and a
private munged (own socket, named to Slurm by ``AuthInfo=socket=``) live in ``root``; client
commands find the config through ``SLURM_CONF`` (``SlurmCluster.env``). The test process cannot
reach the hosts over the network: client commands run inside ``login`` (``SlurmCluster.run``).

Use from a test module (one cluster per session, however many modules pull it in)::

    from slurmkit import SlurmCluster, slurm
    __all__ = ["slurm"]  # the imported fixture: pytest finds it by name in this module

    def test_x(slurm: SlurmCluster) -> None: ...

Tests that leave jobs behind or nodes down should end with ``slurm.reset()``. Skips (never
fails) without root, namespaces or the Slurm/MUNGE binaries. Set ``SLURMKIT_KEEP=1`` to keep
``root`` (logs under ``root/log``) after the session.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import strictkit
from hostkit import Host, HostNet, require_root_netns

WORK_DIR = "/var/lib/batchyard"  # every host's private tmpfs; slurmd's spool lives inside it
SLURMD_SPOOL = f"{WORK_DIR}/slurmd"
BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel",
            "munged", "mungekey", "setpriv")
CPUS, MEMORY_MB = 4, 4000
# squeue's and scontrol's words for jobs that still hold or wait for resources
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING",
                           "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                           "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpus: int = CPUS
    memory_mb: int = MEMORY_MB
    gpus: int = 0


DEFAULT_NODES = (NodeSpec("sn1", gpus=1), NodeSpec("sn2", gpus=1), NodeSpec("sn3"))
# ``urgent`` has a higher PriorityTier: a job there preempts (cancels, PreemptMode=CANCEL) the
# jobs of the other partitions on its nodes, as sites do for a priority queue.
URGENT = "urgent"
DEFAULT_PARTITIONS: dict[str, Sequence[str]] = {"debug": ("sn1", "sn2"), URGENT: ("sn1", "sn2"),
                                                "wide": ("sn1", "sn2", "sn3")}


def render_conf(cluster: str, login_addr: str, nodes: dict[str, tuple[NodeSpec, str]],
                partitions: dict[str, Sequence[str]], root: Path) -> tuple[str, str]:
    """slurm.conf and gres.conf for ``nodes`` (name -> spec, address); the first partition is
    the default. Everything a daemon writes goes under ``root`` or a host's private work dir."""
    gpus = {n: spec.gpus for n, (spec, _) in nodes.items() if spec.gpus}
    lines = [
        f"ClusterName={cluster}",
        f"SlurmctldHost=login({login_addr})",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"AuthInfo=socket={root}/munge/munge.socket",
        f"StateSaveLocation={root}/ctld",
        f"SlurmdSpoolDir={SLURMD_SPOOL}",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={SLURMD_SPOOL}/slurmd.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={MEMORY_MB // CPUS}",  # else a job without --mem takes a whole node
        "SchedulerType=sched/backfill",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=CANCEL",
        "SchedulerParameters=batch_sched_delay=0",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MailProg=/bin/true",
        "SlurmdParameters=config_overrides",  # nodes may claim more CPUs/memory than we have
        "ReturnToService=2",  # a DOWN node is back in service when its slurmd registers
        "SlurmdTimeout=10",  # a dead slurmd: node DOWN, its jobs NODE_FAIL, in ~20 s
        "SlurmctldTimeout=30",
        "InactiveLimit=0",
        "KillWait=2",  # scancel: SIGCONT+SIGTERM, SIGKILL 2 s later
        "MinJobAge=2",  # finished jobs are forgotten >= 2 s later (by a periodic sweep)
        "MessageTimeout=5",
        "TCPTimeout=3",
    ]
    if gpus:
        lines.append("GresTypes=gpu")
    for name, (spec, addr) in nodes.items():
        gres = f" Gres=gpu:{spec.gpus}" if spec.gpus else ""
        lines.append(f"NodeName={name} NodeAddr={addr} NodeHostname={name} CPUs={spec.cpus} "
                     f"RealMemory={spec.memory_mb}{gres} State=UNKNOWN")
    for i, (part, members) in enumerate(partitions.items()):
        default = "YES" if i == 0 else "NO"
        tier = " PriorityTier=10" if part == URGENT else ""
        lines.append(f"PartitionName={part} Nodes={','.join(members)} Default={default}{tier} "
                     "MaxTime=INFINITE State=UP")
    # slurmd 22.05 drops a file-less GPU ("Removing file-less GPU" -> node INVAL), and warns
    # about a File that is not a device: name character devices like /dev/null instead. The
    # number in the name is what CUDA_VISIBLE_DEVICES gets.
    gres_conf = "".join(
        f"NodeName={n} Name=gpu File={root}/dev/nvidia" + (f"[0-{c - 1}]" if c > 1 else "0") + "\n"
        for n, c in gpus.items())
    return "\n".join(lines) + "\n", gres_conf


def _which(name: str) -> str | None:
    """Also in the sbin dirs, which a non-login root shell's PATH may lack."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(name, path=path)


def _bin(name: str) -> str:
    return _which(name) or name


@functools.cache
def slurm_unavailable() -> str | None:
    if missing := [b for b in BINARIES if not _which(b)]:
        return f"Slurm tests need {', '.join(missing)} (apt-get install slurm-wlm munge)"
    return None


def require_slurm() -> None:
    """Skip (not fail) without root, namespaces or the Slurm and MUNGE binaries."""
    require_root_netns()
    if reason := slurm_unavailable():
        strictkit.missing(reason)


def _alive(proc: subprocess.Popen[Any] | None) -> bool:
    return proc is not None and proc.poll() is None


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return "?"


class SlurmCluster:
    """slurmctld in ``login``, ``slurmd -N name`` in one host per node, a private munged.

    Attributes: ``conf`` (slurm.conf), ``env`` (environment for client commands, with
    SLURM_CONF), ``login`` and ``nodes`` (name -> Host), ``addrs`` (node name -> address),
    ``partitions`` (name -> node names, the first is the default), ``gpus`` (node name ->
    GPU gres count), ``root`` (temp dir on the shared fs: logs in ``root/log``, sbatch scripts
    in ``root/jobs``), ``start_seconds`` (how long start() took)."""

    def __init__(self, nodes: Sequence[NodeSpec] = DEFAULT_NODES,
                 partitions: dict[str, Sequence[str]] | None = None,
                 cluster: str = "yard") -> None:
        self.specs = {n.name: n for n in nodes}
        self.partitions = dict(DEFAULT_PARTITIONS if partitions is None else partitions)
        self.cluster = cluster
        self.root = Path(tempfile.mkdtemp(prefix="slurmkit-"))
        self.conf = self.root / "slurm.conf"
        # a test run inside a Slurm job must not leak that job's settings into ours
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_", "SALLOC_"))}
        self.env["SLURM_CONF"] = str(self.conf)
        self.net: HostNet | None = None
        self.login: Host
        self.nodes: dict[str, Host] = {}
        self.addrs: dict[str, str] = {}
        self.gpus = {n.name: n.gpus for n in nodes if n.gpus}
        self.munged: subprocess.Popen[Any] | None = None
        self.slurmctld: subprocess.Popen[Any] | None = None
        self.slurmds: dict[str, subprocess.Popen[Any]] = {}
        self.start_seconds = 0.0
        self._jobs = 0
        self._closed = False
        atexit.register(self.close)

    # -- life cycle -------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> SlurmCluster:
        """Hosts, munged, slurmctld, slurmds; returns once every node is idle and one trivial
        job has run (the first job after a slurmctld start waits ~3 s for the scheduler)."""
        t0 = time.monotonic()
        try:
            self.net = HostNet()
            self.login = self.net.add_host("login", work_dir=WORK_DIR)
            for name in self.specs:
                self.nodes[name] = self.net.add_host(name, work_dir=WORK_DIR)
                self.addrs[name] = self.nodes[name].addr
            for sub in ("log", "ctld", "jobs", "dev"):
                (self.root / sub).mkdir()
            for i in range(max(self.gpus.values(), default=0)):
                os.mknod(self.root / "dev" / f"nvidia{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
            self.root.chmod(0o755)  # munged (user munge) must reach its socket dir
            slurm_conf, gres_conf = render_conf(
                self.cluster, self.login.addr,
                {n: (s, self.addrs[n]) for n, s in self.specs.items()}, self.partitions, self.root)
            self.conf.write_text(slurm_conf)
            if gres_conf:
                (self.root / "gres.conf").write_text(gres_conf)
            self._start_munged()
            with open(self.root / "log" / "slurmctld.out", "ab") as log:
                self.slurmctld = self.login.popen(
                    [_bin("slurmctld"), "-D", "-i"], env=self.env, stdout=log, stderr=log)
            for name in self.specs:
                self.start_slurmd(name, wait=False)
            self.wait_idle(timeout, what="every slurmd registered and idle")
            warm = self.sbatch("true\n", "--output=/dev/null")
            self.wait_job(warm, timeout=timeout, what="the warm-up job")
            self.wait_idle(timeout)
            self.start_seconds = time.monotonic() - t0
            return self
        except BaseException:
            self.close()
            raise

    def _start_munged(self) -> None:
        """Our own munged on a private socket: nothing shared, so nothing to guess at close.

        Runs in the login host (so it dies with the net, whatever happens) as user munge; its
        socket is on the shared filesystem, which every host's mount namespace sees."""
        key = Path("/etc/munge/munge.key")
        if not key.exists():  # a fresh install without the postinst's key
            subprocess.run([_bin("mungekey"), "--create", f"--keyfile={key}"], check=True,
                           timeout=30)
            shutil.chown(key, "munge", "munge")
        mdir = self.root / "munge"
        mdir.mkdir(mode=0o755)
        shutil.chown(mdir, "munge", "munge")
        with open(self.root / "log" / "munged.out", "ab") as log:
            self.munged = self.login.popen(
                ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups", _bin("munged"), "-F",
                 f"--socket={mdir}/munge.socket", f"--pid-file={mdir}/munged.pid",
                 f"--seed-file={mdir}/munged.seed", f"--key-file={key}"],
                stdout=log, stderr=log)
        sock = mdir / "munge.socket"
        deadline = time.monotonic() + 15
        while not sock.exists():
            if not _alive(self.munged) or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self._tail('munged.out')}")
            time.sleep(0.02)

    def close(self) -> None:
        """Idempotent: daemons get SIGTERM, then every process left in any host (slurmstepd,
        job processes) SIGKILL, by pid; munged dies with the login host."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        procs = [p for p in (self.slurmctld, *self.slurmds.values(), self.munged) if p]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        try:
            if self.net is not None:
                self.net.close()
        finally:
            if not os.environ.get("SLURMKIT_KEEP"):
                shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- daemons ----------------------------------------------------------------------------

    def slurmd_pid(self, name: str) -> int | None:
        """The pid of node ``name``'s slurmd if it is running (not a zombie), else None."""
        p = self.slurmds.get(name)
        return p.pid if p is not None and _alive(p) else None

    def kill_slurmd(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal slurmd only: its slurmstepds and job processes keep running, as on a node
        whose daemon crashed. After SIGKILL the node is ``NOT_RESPONDING`` in ~10 s and DOWN
        (reason "Not responding"), its jobs NODE_FAIL (or requeued), in ~20 s."""
        p = self.slurmds[name]
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            p.wait(timeout=10)

    def start_slurmd(self, name: str, wait: bool = True, timeout: float = 30) -> None:
        """(Re)start node ``name``'s slurmd; with ``wait``, until the node is responding and
        neither DOWN nor DRAIN (ReturnToService=2 does that on registration, within ~0.3 s; a
        node still DOWN/DRAIN after half the timeout is resumed with scontrol)."""
        if self.slurmd_pid(name) is not None:
            raise RuntimeError(f"slurmd on {name} is already running")
        host = self.nodes[name]
        host.run(["mkdir", "-p", SLURMD_SPOOL], check=True)
        with open(self.root / "log" / f"slurmd-{name}.out", "ab") as log:
            self.slurmds[name] = host.popen([_bin("slurmd"), "-D", "-N", name], env=self.env,
                                            stdout=log, stderr=log)
        if not wait:
            return
        deadline, resumed = time.monotonic() + timeout, False
        while True:
            state = self.node_states().get(name, "")
            if state and not state.endswith("*") and not state.startswith(("down", "drain")):
                return
            if not _alive(self.slurmds[name]):
                raise RuntimeError(f"slurmd {name} exited: {self._tail(f'slurmd-{name}.out')}")
            if not resumed and time.monotonic() > deadline - timeout / 2 and \
                    state.startswith(("down", "drain")) and not state.endswith("*"):
                self.resume(name)
                resumed = True
            if time.monotonic() > deadline:
                raise AssertionError(f"node {name} not back in service after {timeout:g}s: "
                                     f"{state!r}")
            time.sleep(0.1)

    def job_pids(self, name: str) -> list[int]:
        """Processes in node ``name``'s host other than those the harness started (its slurmd):
        slurmstepds and the jobs' processes, including strays of finished jobs."""
        host = self.nodes[name]
        ours = {p.pid for p in host.procs if _alive(p)}
        return [pid for pid in host.pids() if pid not in ours]

    # -- client commands --------------------------------------------------------------------

    def run(self, argv: Sequence[str | Path], timeout: float = 30, check: bool = False,
            host: Host | None = None, cwd: str | Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        """A client command (sbatch, squeue, ...) in ``login`` (or ``host``) with SLURM_CONF;
        the cwd defaults to ``root`` (shared by all hosts: sbatch makes it the job's cwd)."""
        if not _alive(self.slurmctld) and not self._closed:
            raise RuntimeError(f"slurmctld died: {self._tail('slurmctld.out')}")
        res = (host or self.login).run(argv, env=self.env, timeout=timeout,
                                       cwd=self.root if cwd is None else cwd)
        if check and res.returncode != 0:
            raise AssertionError(f"{shlex.join(map(str, argv))} failed (rc {res.returncode}): "
                                 f"{res.stderr.strip()}")
        return res

    def json_text(self, argv: Sequence[str]) -> str:
        """A client command with ``--json`` (squeue and sinfo; 22.05's scontrol has none),
        its output as printed (22.05 escapes ``/`` as ``\\/``)."""
        return self.run([*argv, "--json"], check=True).stdout

    def json(self, argv: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.json_text(argv))
        return out

    def squeue_json(self) -> dict[str, Any]:
        """``squeue --json``: every job slurmctld still holds, finished ones included (purged
        some seconds after MinJobAge=2 s; 7 s seen). 22.05 ignores squeue's filters (-t, -j)
        with --json: filter the records yourself."""
        return self.json(["squeue", "--all"])

    def sinfo_json(self) -> dict[str, Any]:
        """``sinfo --json``: one record per node (name, address, cpus, real_memory, gres,
        state, state_flags, reason, ...), not per partition as plain sinfo prints."""
        return self.json(["sinfo"])

    nodes_json = sinfo_json  # 22.05: `scontrol show node --json` does not exist (23.02 has it)

    def jobs(self) -> dict[int, dict[str, Any]]:
        """squeue --json's job records by job id."""
        return {j["job_id"]: j for j in self.squeue_json()["jobs"]}

    def job_state(self, job_id: int) -> str | None:
        """``scontrol show job``'s JobState (PENDING, RUNNING, COMPLETED, NODE_FAIL, ...), or
        None once slurmctld has forgotten the job."""
        res = self.run(["scontrol", "-o", "show", "job", str(job_id)])
        if res.returncode != 0:
            return None
        for item in res.stdout.split():
            if item.startswith("JobState="):
                return item.split("=", 1)[1]
        return None

    def wait_job(self, job_id: int, states: Sequence[str] | None = None, timeout: float = 30,
                 what: str | None = None) -> str | None:
        """Until the job is in one of ``states`` (default: any finished state, or forgotten);
        returns that state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if (state in states) if states is not None else (state not in ACTIVE_STATES):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for "
                                     f"{what or f'job {job_id}'}: {state}")
            time.sleep(0.05)

    def node_states(self) -> dict[str, str]:
        """sinfo's long state per node: idle, allocated, mixed, completing, down*, drained,
        draining, idle* ... (``*``: not responding)."""
        res = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=True)
        return dict(line.split() for line in sorted(set(res.stdout.splitlines())) if line.strip())

    def sbatch(self, script: str, *args: str, cwd: str | Path | None = None) -> int:
        """Submit ``script`` (written to ``root/jobs``; ``#!/bin/sh`` unless it has a #!) with
        ``sbatch --parsable ARGS``; returns the job id."""
        self._jobs += 1
        path = self.root / "jobs" / f"job{self._jobs}.sh"
        path.write_text(script if script.startswith("#!") else "#!/bin/sh\n" + script)
        res = self.run(["sbatch", "--parsable", *args, str(path)], check=True, cwd=cwd)
        return int(res.stdout.strip().split(";")[0])

    def drain(self, name: str, reason: str) -> None:
        self.run(["scontrol", "update", f"nodename={name}", "state=drain", f"reason={reason}"],
                 check=True)

    def resume(self, name: str) -> None:
        self.run(["scontrol", "update", f"nodename={name}", "state=resume"], check=True)

    def active_jobs(self) -> list[str]:
        """``JOBID STATE`` of every job not yet finished (squeue's default selection)."""
        res = self.run(["squeue", "-h", "-o", "%i %T"], check=True)
        return [line for line in res.stdout.splitlines() if line.strip()]

    def cancel_all(self) -> None:
        if ids := [line.split()[0] for line in self.active_jobs()]:
            self.run(["scancel", *ids])

    def wait_idle(self, timeout: float = 30, what: str = "Slurm idle") -> None:
        """Until every node is plain ``idle``, no job is pending, running or completing, and no
        job process is left in any node host (a slurmd restarted after a kill reaps its node's
        orphaned steps ~2 s after registering)."""
        deadline = time.monotonic() + timeout
        while True:
            states, jobs = self.node_states(), self.active_jobs()
            strays = {n: pids for n in self.nodes if (pids := self.job_pids(n))}
            if set(states) == set(self.specs) and set(states.values()) == {"idle"} \
                    and not jobs and not strays:
                return
            for name, p in self.slurmds.items():
                if not _alive(p):
                    raise RuntimeError(f"slurmd {name} exited: "
                                       f"{self._tail(f'slurmd-{name}.out')}")
            if time.monotonic() > deadline:
                procs = {n: [_cmdline(p) for p in pids] for n, pids in strays.items()}
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}: nodes "
                                     f"{states}, jobs {jobs}, job processes {procs}")
            time.sleep(0.1)

    def reset(self, timeout: float = 40) -> None:
        """Back to a clean state between tests: jobs cancelled, dead slurmds restarted, every
        node resumed and idle, no job process left."""
        self.cancel_all()
        for name in self.specs:
            if self.slurmd_pid(name) is None:
                self.start_slurmd(name, wait=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if not any(s.endswith("*") for s in states.values()):
                if stuck := [n for n, s in states.items() if s.startswith(("down", "drain"))]:
                    self.run(["scontrol", "update", f"nodename={','.join(stuck)}",
                              "state=resume"], check=True)
                break
            time.sleep(0.1)
        self.wait_idle(max(1.0, deadline - time.monotonic()), what="Slurm idle after reset")

    def _tail(self, *logs: str, n: int = 15) -> str:
        out = []
        for name in logs:
            with contextlib.suppress(OSError):
                lines = (self.root / "log" / name).read_text(errors="replace").splitlines()
                out.append(f"[{name}] " + " | ".join(lines[-n:]))
        return "; ".join(out) or "(no log)"


_shared: SlurmCluster | None = None
_users = 0


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """One cluster per test session: nodes sn1, sn2 (1 GPU gres each), sn3, 4 CPUs and
    4000 MB each; partitions debug (default: sn1, sn2), urgent (sn1, sn2, preempts the
    others) and wide (sn1-sn3).

    Shared even when several modules import this fixture (each import makes a fixture
    definition of its own, so the cluster is counted, not cached by pytest): the last user
    to finish, at session end, closes it."""
    global _shared, _users
    require_slurm()
    if _shared is None:
        _shared = SlurmCluster().start()
    _users += 1
    try:
        yield _shared
    finally:
        _users -= 1
        if _users == 0:
            _shared.close()
            _shared = None
