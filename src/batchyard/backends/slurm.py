"""Slurm: a cluster is a partition of a real Slurm, nodes are the partition's nodes, and a gang
is one `sbatch` job whose script `srun`s the node launcher once per node. Slurm decides when
and where the gang runs (its queue, its priorities, other users); batchyard hands the gang
over at once, shows Slurm's pending reason, and learns the nodes when the job starts. From
there the launchers talk to the server over the node channel, as on every backend.

The server runs where Slurm's client commands work (a login node: slurm-client, munge, the
cluster's slurm.conf or ``SLURM_CONF``), and batchyard is installed at the same path on the
nodes (a shared software stack, as Slurm sites have). mpirun's daemons are started through the
batchyard relay, not `srun`: the same path as every other backend, no PMI or ``MpiDefault``
to configure, and the daemons stay in the launcher's process tree, so teardown finds them."""

from __future__ import annotations

import json
import math
import os
import pwd
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

from batchyard.backends import slurm_cli
from batchyard.backends.base import Gang, NodeInfo, QueueState
from batchyard.backends.dryrun import render_dry_run
from batchyard.errors import Unsupported

DEFAULT_WORK_DIR = "/tmp/batchyard-slurm"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
WALL_CLOCK_MARGIN = 120.0  # --time backs the launcher's own limit; it never races it


def settings(spec: dict[str, Any]) -> dict[str, Any]:
    return dict(spec.get("slurm") or {})


def work_dir(spec: dict[str, Any]) -> str:
    return str(settings(spec).get("work_dir") or DEFAULT_WORK_DIR)


def job_name(gang: Gang) -> str:
    """Unique per attempt, so a server that died between sbatch and its commit finds the job
    it already submitted instead of submitting a second one."""
    return f"by-{gang.job_name}-{gang.attempt_uuid[:8]}"


def time_limit(gang: Gang) -> str | None:
    limits = gang.spec.get("limits") or {}
    wall = limits.get("max_wall_clock")
    if not wall:
        return None
    seconds = float(wall) + float(limits.get("grace_period", 30.0)) + WALL_CLOCK_MARGIN
    return str(max(1, math.ceil(seconds / 60.0)))  # minutes


def render_script(gang: Gang, *, mask: bool = False) -> str:
    """The exact batch script: `job create --dry-run` prints it (credentials masked) and
    `launch` submits the same text."""
    opts = settings(gang.cluster_spec)
    size = gang.cluster_size
    nodes = gang.num_nodes
    cpus = int(size.get("vcpus") or 1)
    gpus = int(size.get("gpus") or 0)
    node_dir = work_dir(gang.cluster_spec)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name(gang)}"]
    if opts.get("partition"):
        lines.append(f"#SBATCH --partition={opts['partition']}")
    lines += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
              f"#SBATCH --cpus-per-task={cpus}"]
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{gpus}")
    limit = time_limit(gang)
    if limit:
        lines.append(f"#SBATCH --time={limit}")
    # Slurm opens --output before the script runs and fails the job (JobLaunchFailure) when
    # its directory does not exist yet on the batch host; Slurm never creates directories.
    # So the script makes the node work dir and sends its output (srun's, i.e. every node
    # launcher's stdout and stderr) to slurm-<job id>.out there itself.
    # --export=ALL of the environment sbatch runs with, which holds Slurm's own variables
    # only (submit_environ): the job gets them and what the script exports below, never the
    # server's. --export=NONE would say the same but makes slurmd build the user's login
    # environment first (`su - USER`: the login shell's profile), a second or more per job.
    lines += ["#SBATCH --output=/dev/null", "#SBATCH --chdir=/tmp", "#SBATCH --exclusive",
              "#SBATCH --no-requeue", "#SBATCH --export=ALL",
              f"#SBATCH --comment=batchyard-attempt-{gang.attempt_uuid}"]
    for key in ("account", "qos", "constraint"):
        if opts.get(key):
            lines.append(f"#SBATCH --{key}={opts[key]}")
    for key, value in sorted((opts.get("options") or {}).items()):
        lines.append(f"#SBATCH --{key}" + (f"={value}" if value not in ("", None) else ""))
    python = str(opts.get("python") or sys.executable)
    bundle = {
        "server": gang.server_url, "servers": list(gang.servers), "attempt": gang.attempt_uuid,
        "tickets": ["***" if mask else t for t in gang.launch_tokens],
        "ca_pem": _ca_pem(gang.ca_file),
    }
    srun = ["srun", "--export=ALL", "--input=all", f"--nodes={nodes}", f"--ntasks={nodes}",
            "--ntasks-per-node=1", f"--cpus-per-task={cpus}", "--kill-on-bad-exit=0",
            python, "-S", "-m", "batchyard.node.slurm", node_dir]
    lines += [
        f"# batchyard job {gang.workspace}/{gang.experiment}/{gang.job_name}, attempt "
        f"{gang.attempt}: one node launcher per node; they report to the server over HTTP",
        *(f"export {key}={shlex.quote(value)}" for key, value in job_environ().items()),
        f"export PYTHONPATH={shlex.quote(_PACKAGE_ROOT)}",
        "export BATCHYARD_LAUNCHER=1",
        f"mkdir -p {shlex.quote(node_dir)}",
        f'exec >>{shlex.quote(node_dir)}/slurm-"$SLURM_JOB_ID".out 2>&1',
        shlex.join(srun) + " <<'BATCHYARD_TICKETS'",
        json.dumps(bundle, separators=(",", ":")),
        "BATCHYARD_TICKETS",
    ]
    return "\n".join(lines) + "\n"


def job_environ() -> dict[str, str]:
    """The job's own environment besides Slurm's (SLURM_*, TMPDIR) and the env contract, which
    the launcher adds: the user's account as a login would set it, and the server's PATH
    (batchyard and Python live at the same paths on the nodes)."""
    try:
        account = pwd.getpwuid(os.getuid())
        user: dict[str, str] = {"HOME": account.pw_dir, "USER": account.pw_name,
                                "LOGNAME": account.pw_name, "SHELL": account.pw_shell}
    except KeyError:  # a uid without a passwd entry (a container): Slurm's variables only
        user = {}
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **user}


def submit_environ(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What sbatch runs with, so what the job inherits under --export=ALL: Slurm's own input
    variables of the server (SLURM_CONF, SBATCH_ACCOUNT, ...), which Slurm propagates to a
    job in any case, and nothing else of its environment (its tokens, its home). Not the
    ones that would bring the login environment back (SBATCH_EXPORT, SBATCH_GET_USER_ENV):
    sbatch's environment variables take precedence over the script's #SBATCH lines."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k.startswith(("SLURM_", "SBATCH_"))
            and k not in ("SBATCH_EXPORT", "SBATCH_GET_USER_ENV")}


def _ca_pem(ca_file: str | None) -> str | None:
    if not ca_file:
        return None
    try:
        return Path(ca_file).read_text()
    except OSError:
        return None


class SlurmBackend:
    """Slurm's controller is shared and each look at it is a command (a process, an RPC to
    slurmctld, JSON to parse), so the server looks seldom: `sinfo` at most every SINFO_TTL
    seconds for every cluster together, `squeue` once per SQUEUE_TTL for every attempt, and
    neither on the way from submit to the ranks (the launchers' plan requests say when and
    where the gang started: ``started_from``)."""

    name = "slurm"
    SQUEUE_TTL = 0.5  # one `squeue --json` answers every attempt's look in that window
    SINFO_TTL = 5.0  # node discovery runs every reconciler pass; Slurm's nodes change slowly

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._squeue: tuple[float, dict[int, slurm_cli.SlurmJob]] | None = None
        self._sinfo: tuple[float, list[slurm_cli.SlurmNode]] | None = None

    def _jobs(self) -> dict[int, slurm_cli.SlurmJob]:
        with self._lock:
            if self._squeue is None or time.monotonic() - self._squeue[0] > self.SQUEUE_TTL:
                self._squeue = (time.monotonic(), {j.job_id: j for j in slurm_cli.jobs()})
            return self._squeue[1]

    def _forget(self) -> None:
        with self._lock:
            self._squeue = None

    def _nodes(self, partition: str | None) -> list[slurm_cli.SlurmNode]:
        with self._lock:
            if self._sinfo is None or time.monotonic() - self._sinfo[0] > self.SINFO_TTL:
                self._sinfo = (time.monotonic(), slurm_cli.nodes())
            found = self._sinfo[1]
        return [n for n in found if partition in n.partitions] if partition else found

    # --- nodes: the partition's -------------------------------------------------------------

    def discover(self, cluster: str, workspace: str, spec: dict[str, Any]) -> list[NodeInfo]:
        opts = settings(spec)
        directory = work_dir(spec)
        found = []
        for i, node in enumerate(self._nodes(opts.get("partition"))):
            found.append(NodeInfo(
                node.name, i, node.address, directory,
                {"cpus": node.cpus, "gpus": node.gpus, "memory_gb": round(node.memory_mb / 1024,
                                                                           1),
                 # which GPUs a job gets is Slurm's choice, known on the node
                 # (CUDA_VISIBLE_DEVICES of the job's step); see node.launcher._meet_gang
                 "slurm_states": list(node.states)},
                unusable=None if node.usable else node.why_unusable))
        return found

    def request_resources(self, spec: dict[str, Any], bundles: list[dict[str, float]]) -> None:
        """Slurm owns its nodes: there is nothing to ask for."""

    def provision_node(self, cluster: str, workspace: str, index: int,
                       size: dict[str, Any]) -> NodeInfo:
        raise Unsupported(f"cluster {cluster!r}: Slurm owns its nodes; they are the "
                          "partition's, and cannot be added or resized from batchyard")

    def remove_node(self, node: NodeInfo) -> None:
        """A node that left the partition is Slurm's business."""

    # --- gangs ------------------------------------------------------------------------------

    def dry_run(self, gang: Gang) -> str:
        script = render_script(gang, mask=True)
        return ("# sbatch --parsable <<EOF   (the batch script, exactly as submitted; sbatch "
                "runs with Slurm's own SLURM_*/SBATCH_* variables only)\n"
                + script + "# EOF\n\n# what each node runs once Slurm has allocated it "
                "(shown on the partition's first nodes):\n" + render_dry_run(gang))

    def launch(self, gang: Gang) -> dict[str, Any]:
        """``sbatch --parsable``, at once. Only a launch that may have been made before (a
        server killed between sbatch and the commit of its answer) asks the queue first,
        for the job named after the attempt, so that it is never submitted twice."""
        name = job_name(gang)
        mine: list[slurm_cli.SlurmJob] = []
        if gang.maybe_submitted:
            self._forget()
            mine = [j for j in self._jobs().values()
                    if j.name == name and j.comment.endswith(gang.attempt_uuid)]
        job_id = mine[0].job_id if mine else slurm_cli.submit(render_script(gang),
                                                              env=submit_environ())
        self._forget()
        return {"backend": self.name, "slurm_job_id": job_id, "slurm_job_name": name,
                "nodes_wanted": gang.num_nodes, "attempt": gang.attempt_uuid,
                "launched_at": time.time()}

    def started_from(self, handle: dict[str, Any], node_rank: int,
                     allocation: dict[str, str]) -> QueueState | None:
        """A launcher's plan request names its Slurm job, the job's node list and its own
        node (its step's SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURMD_NODENAME): the gang runs
        there, in the list's order, if that is this handle's job, the list has the gang's
        size and this launcher's node is at its rank in it (SLURM_NODEID orders nodes as
        the list does, save in odd node orders of a slurm.conf: then squeue decides)."""
        job_id = str(handle.get("slurm_job_id") or "")
        if not job_id or str(allocation.get("job") or "") != job_id:
            return None
        try:
            nodes = slurm_cli.expand_hostlist(str(allocation.get("nodes") or ""))
        except ValueError:
            return None
        wanted = int(handle.get("nodes_wanted") or 0)
        if len(nodes) != wanted or not 0 <= node_rank < wanted \
                or nodes[node_rank] != allocation.get("node") or len(set(nodes)) != wanted:
            return None
        return QueueState("running", f"Slurm job {job_id} RUNNING", tuple(nodes),
                          external_id=job_id)

    def queue_state(self, handle: dict[str, Any], fresh: bool = False) -> QueueState:
        if fresh:
            self._forget()
        job_id = int(handle["slurm_job_id"])
        job = self._jobs().get(job_id)
        external = str(job_id)
        if job is None:
            return QueueState("ended", f"Slurm job {job_id} is gone from Slurm's queue",
                              external_id=external)
        if job.state == "PENDING" or (job.alive and not job.started):
            return QueueState("pending", job.pending_text(), external_id=external)
        if job.alive:
            # srun kills the other nodes' tasks as soon as slurmctld finds a node dead, a
            # moment before the job turns NODE_FAIL: a fresh look names the failed node then
            failed = self._failed_nodes(job.nodes) if fresh else []
            why = ", ".join(f"{n.name} ({n.why_unusable})" for n in failed)
            return QueueState("running", f"node {why} failed under Slurm job {job_id}"
                              if failed else f"Slurm job {job_id} {job.state}", tuple(job.nodes),
                              lost_nodes=tuple(n.name for n in failed), external_id=external)
        return self._ended(job)

    @staticmethod
    def _failed_nodes(names: tuple[str, ...]) -> list[slurm_cli.SlurmNode]:
        try:
            states = {n.name: n for n in slurm_cli.nodes()}
        except Exception:  # the failure is reported either way
            return []
        return [states[n] for n in names if n in states and states[n].failed]

    def _ended(self, job: slurm_cli.SlurmJob) -> QueueState:
        external = str(job.job_id)
        what = f"Slurm job {job.job_id} ended {job.state}"
        if job.reason and job.reason != "None":
            what += f" ({job.reason})"
        if job.state == "NODE_FAIL":
            down = self._failed_nodes(job.nodes)
            detail = ", ".join(f"{n.name} ({n.why_unusable})" for n in down)
            reason = f"node {detail} failed" if down else "a node failed"
            return QueueState("ended", f"{reason}: {what}", tuple(job.nodes),
                              lost_nodes=tuple(n.name for n in down), external_id=external)
        if job.state == "PREEMPTED":
            return QueueState("ended", f"preempted by Slurm: {what}", tuple(job.nodes),
                              preempted=True, external_id=external)
        if job.state == "TIMEOUT":
            return QueueState("ended", f"Slurm's time limit (--time) was reached: {what}",
                              tuple(job.nodes), external_id=external)
        return QueueState("ended", what, tuple(job.nodes), external_id=external)

    def alive(self, handle: dict[str, Any]) -> list[bool | None]:
        """Launchers live as long as their Slurm job holds its allocation: once it has ended,
        a launcher without a final report is gone with it."""
        count = int(handle.get("nodes_wanted") or len(handle.get("node_names") or []))
        try:
            state = self.queue_state(handle)
        except Exception:
            return [None] * count
        return [None] * count if state.state != "ended" else [False] * count

    def stop(self, handle: dict[str, Any], node_rank: int) -> None:
        """Slurm kills every process of the job on every node (its step's tasks and all
        they started) when the job is cancelled."""
        self.cancel(handle)

    def cancel(self, handle: dict[str, Any]) -> None:
        if handle.get("slurm_job_id"):
            slurm_cli.cancel(int(handle["slurm_job_id"]))
            self._forget()

    def exec(self, node: NodeInfo, argv: list[str], timeout: float) -> tuple[int, str, str]:
        """Through Slurm (`srun -w NODE`): the server has no other way onto a Slurm node."""
        if not argv:
            raise Unsupported("exec: give a command")
        wait = max(1, int(timeout))
        proc = slurm_cli.run(["srun", f"--nodelist={node.name}", "--nodes=1", "--ntasks=1",
                              f"--immediate={wait}", "--quiet", "--", *argv],
                             timeout=timeout + 15, check=False)
        return proc.returncode, proc.stdout, proc.stderr
