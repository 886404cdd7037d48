"""The mpirun line node 0 runs for an MPI gang, for the job's MPI flavour: Open MPI, or a
Hydra-based MPI (MPICH, Intel MPI: node/hydra.py). Either way the hostfile names nodes (never
addresses: local nodes share 127.0.0.1 and Open MPI rejects a host listed twice) and the
batchyard rsh agent stands in for ssh.

The flavour is the job's (``distribution["mpi_flavour"]``), else what the job's own
``mpirun --version`` says: a job environment (a virtualenv with PyPI's ``mpich``, an image
with Intel MPI) brings its MPI with it, and the hostfile format, the launcher options and the
variables a user's own mpirun needs all follow from it. ``resolve_flavour`` settles it once
per node, before the hostfile and the environment are written, and records it in the plan.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchyard.node import hydra, ompi
from batchyard.node.env import node_dirs
from batchyard.node.plan import NodePlan

FLAVOURS = ("openmpi", "mpich", "intelmpi")
DEFAULT_FLAVOUR = "openmpi"
DETECT_TIMEOUT = 10.0

Run = Callable[..., "subprocess.CompletedProcess[Any]"]


def flavour_of(version_text: str) -> str | None:
    """The flavour an ``mpirun --version`` output names, if it names one. Intel MPI first:
    its Hydra is MPICH's descendant and older releases print HYDRA build details too."""
    text = version_text.lower()
    if "intel(r) mpi" in text or "intel mpi" in text:
        return "intelmpi"
    if "open mpi" in text or "open-mpi" in text or "open rte" in text:
        return "openmpi"
    if "hydra build details" in text or "mpich" in text:
        return "mpich"
    return None


def detect_flavour(mpirun: str = "mpirun", run: Run = subprocess.run,
                   env: dict[str, str] | None = None) -> str:
    """Ask ``mpirun --version`` which MPI it is (Open MPI when it cannot say: no mpirun, a
    hang, an unknown MPI), as the job's processes would find it (``env``: their PATH)."""
    try:
        done = run([mpirun, "--version"], capture_output=True, text=True,
                   timeout=DETECT_TIMEOUT, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_FLAVOUR
    found = flavour_of(f"{done.stdout or ''}\n{done.stderr or ''}")
    return found or DEFAULT_FLAVOUR


def job_path(plan: NodePlan) -> str:
    """PATH as the job's processes get it on the host: environment.python's directory first
    (the launcher's _prepare_python does the same), so a virtualenv's own mpirun wins."""
    target = Path(plan.python or sys.executable)
    return f"{target.parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"


def job_mpirun(plan: NodePlan) -> str:
    """The mpirun the job's processes would run: inside a container the image's (found on
    its PATH there), on the host the first on the job's PATH."""
    if (plan.container or {}).get("image"):
        return "mpirun"
    return shutil.which("mpirun", path=job_path(plan)) or "mpirun"


def resolve_flavour(plan: NodePlan, mpirun: str | None = None, run: Run = subprocess.run,
                    detect: bool = True) -> str:
    """The job's flavour, else the one its mpirun reports (unless ``detect`` is False: Open
    MPI, not recorded, so that a later call, e.g. inside the node's container, still asks).
    A flavour found is recorded in ``plan.distribution["mpi_flavour"]``, where the env,
    the hostfile and mpirun_argv read it."""
    given = plan.distribution.get("mpi_flavour")
    if given:
        return str(given)
    if not detect:
        return DEFAULT_FLAVOUR
    env = None
    if mpirun is None:
        mpirun = job_mpirun(plan)
        env = {**os.environ, "PATH": job_path(plan)}  # Intel's mpirun script needs its PATH
    found = detect_flavour(mpirun, run, env)
    plan.distribution["mpi_flavour"] = found
    return found


def flavour_in(plan: NodePlan) -> str:
    """The flavour resolve_flavour recorded (or the job gave); Open MPI before either."""
    return str(plan.distribution.get("mpi_flavour") or DEFAULT_FLAVOUR)


def hostfile_lines(plan: NodePlan, flavour: str | None = None) -> list[str]:
    """One line per node, node names in rank order: ``name slots=N`` for Open MPI, Hydra's
    ``name:N`` for MPICH and Intel MPI (neither parses the other's)."""
    ppn = plan.processes_per_node
    if (flavour or flavour_in(plan)) in hydra.FLAVOURS:
        return [f"{name}:{ppn}" for name in plan.node_names]
    return [f"{name} slots={ppn}" for name in plan.node_names]


def process_count(plan: NodePlan) -> int:
    dist = plan.distribution
    return int(dist.get("process_count") or plan.num_nodes * plan.processes_per_node)


def mpirun_argv(plan: NodePlan, flavour: str | None = None,
                mpirun: str | None = None) -> list[str]:
    """Node 0's mpirun line for ``flavour`` (default: the plan's, Open MPI until one is
    recorded: no detection here, so a dry run on the server stays pure)."""
    flavour = flavour or flavour_in(plan)
    mpirun = mpirun or job_mpirun(plan)
    command = plan.command
    user = shlex.join(command) if isinstance(command, list) else str(command or "")
    if flavour in hydra.FLAVOURS:
        argv = hydra.mpiexec_argv(plan, mpirun, str(node_dirs(plan).hostfile),
                                  process_count(plan))
    else:
        argv = ompi.openmpi_argv(plan, mpirun, str(node_dirs(plan).hostfile),
                                 process_count(plan))
    argv += [str(a) for a in plan.distribution.get("mpirun_args") or []]
    argv += [str(a) for a in plan.distribution.get("mpi_extra_args") or []]
    shim = HYDRA_RANK_SHIM if flavour in hydra.FLAVOURS else RANK_SHIM
    argv += ["bash", "-c", shim, "batchyard-mpi-rank", user]
    return argv


def mpirun_env(plan: NodePlan, hostfile: Path) -> dict[str, str]:
    """What a user's own mpirun (customMpiSettings, horovodSettings: ``mpirun -hostfile
    $AZ_BATCHAI_MPI_HOST_FILE ...``) needs to start its ranks as batchyard's line does:
    the relay for ssh, the hostfile, the network, for the plan's flavour."""
    env = {"AZ_BATCHAI_MPI_HOST_FILE": str(hostfile)}
    flavour = flavour_in(plan)
    if flavour in hydra.FLAVOURS:
        env.update(hydra.user_env(plan, str(hostfile)))
        return env
    if plan.rsh_agent:
        env["OMPI_MCA_plm_rsh_agent"] = " ".join(plan.rsh_agent)
        if "SLURM_JOB_ID" in os.environ:  # a user's own mpirun inside a Slurm job
            env["OMPI_MCA_plm"] = "rsh"
            env["OMPI_MCA_ras"] = "^slurm"
    env.update(ompi.mca_env(plan))
    return env


# Each MPI rank writes its own log files, named like every other rank's, and leaves its exit
# code behind so a failure can name the rank rather than just "mpirun failed". Open MPI
# numbers ranks in OMPI_COMM_WORLD_RANK, Hydra (MPICH, Intel MPI) in PMI_RANK.
RANK_SHIM = (
    # mpirun starts remote ranks in its own directory, node 0's, which other nodes lack
    # (Open MPI falls back to $HOME, Hydra fails; mpiexec runs with -wdir /): each rank
    # starts in its own node's work dir
    'cd "$BATCHYARD_WORK_DIR" 2>/dev/null; '
    # mpirun called by its absolute path puts its own bin first on the ranks' PATH (as
    # --prefix would): `python`, `python3` and `pip` must stay the job's (node/env.py)
    '[ -n "$BATCHYARD_JOB_BIN" ] && PATH="$BATCHYARD_JOB_BIN:$PATH"; '
    'd="$AZ_BATCHAI_STDOUTERR_DIR"; r="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"; '
    'f="$d/${BATCHYARD_NODE_NAME}-rank$r"; '
    'bash -c "$1" >>"$f.stdout.txt" 2>>"$f.stderr.txt"; rc=$?; '
    'mkdir -p "$BATCHYARD_JOB_DIR/.batchyard/mpi"; '
    'echo "$rc $BATCHYARD_NODE_NAME" > "$BATCHYARD_JOB_DIR/.batchyard/mpi/rank-$r.exit"; '
    'exit $rc'
)
# Open MPI's mpirun ends the job when any rank exits non-zero. Hydra only when one ends by a
# signal: after a rank that never called MPI_Finalize exits with a code, mpiexec can wait
# forever (its proxy is gone when it tries to signal it; seen here with one rank per node).
# So under Hydra a failed rank's shim, its exit code recorded, ends itself by SIGTERM; a
# second later, so that its node's launcher has reported the failed rank before mpiexec (which
# waits for the shim) can end and node 0 report only "mpirun failed" (a race seen here).
HYDRA_RANK_SHIM = RANK_SHIM.replace(
    "exit $rc", '[ "$rc" = 0 ] || { sleep 1; kill -TERM $$; }; exit $rc')


def failed_rank(attempt_dir: str) -> tuple[int, int, str] | None:
    """(rank, exit code, node) of the first MPI rank that exited non-zero, if any did."""
    found = []
    for path in (Path(attempt_dir) / ".batchyard" / "mpi").glob("rank-*.exit"):
        try:
            code_text, node = path.read_text().split()[:2]
            code = int(code_text)
        except (OSError, ValueError):
            continue
        if code != 0:
            found.append((path.stat().st_mtime, int(path.stem.split("-")[1]), code, node))
    if not found:
        return None
    _, rank, code, node = min(found)
    return rank, code, node


TEARDOWN_NOTE = ("[batchyard] the signal report above is mpirun's own, printed while it "
                 "tore the job down after {cause}: it is not the job's error")


def label_teardown(stderr: Path, cause: str) -> bool:
    """After a failed MPI job, say under mpirun's own crash report (Open MPI's mpirun can
    crash in its teardown, e.g. in PMIx_Finalize) that it is aftermath, not the cause.
    Appended, so the lines already shipped stay as they are. Whether a note was added."""
    from batchyard.failure_record import signal_reports

    try:
        lines = stderr.read_text(errors="replace").splitlines()
    except OSError:
        return False
    spans = signal_reports(lines, mpirun_only=False)  # (the ranks' reports are in their files)
    if not spans or any(line.startswith("[batchyard]") for line in lines[spans[-1][1]:]):
        return False
    with open(stderr, "a") as fh:
        fh.write(TEARDOWN_NOTE.format(cause=cause.rstrip(".")) + "\n")
    return True


# Open MPI's mpirun saying that a rank failed (help-orterun.txt): what it prints before it
# tears the job down
_RANK_FAILED = re.compile(r"Primary job\s+terminated normally, but \d+ process(?:es)? returned|"
                          r"mpirun noticed that process rank \d+|"
                          r"mpirun detected that one or more processes exited with non-zero|"
                          r"MPI_ABORT was invoked on rank")


def label_mpirun_teardown(stderr: Path, abort: Path, node_rank: int, own: str | None,
                          wait: float = 3.0) -> bool:
    """Label mpirun's crash report in its log (label_teardown) when a rank's failure came
    first: one named in the gang's abort (another node's rank; it may still be on its way
    from the server, so it is waited for a moment), this node's own ``MPI rank ...``
    failure, or, failing both, mpirun's own words above the report that a rank failed.
    Without any, mpirun's crash is the error itself and stays as it is."""
    from batchyard.failure_record import signal_reports
    from batchyard.node.plan import read_json

    try:
        lines = stderr.read_text(errors="replace").splitlines()
    except OSError:
        return False
    reports = signal_reports(lines, mpirun_only=False)
    if not reports:
        return False
    said = bool(_RANK_FAILED.search("\n".join(lines[:reports[0][0]])))
    deadline = time.time() + wait
    while True:
        found = read_json(abort) or {}
        if found.get("message") and found.get("node_rank") != node_rank:
            return label_teardown(stderr, str(found["message"]))
        if own and own.startswith("MPI rank "):
            return label_teardown(stderr, own)
        if time.time() > deadline:
            return said and label_teardown(stderr, "a rank failed (mpirun says so above; the "
                                           "job's cause names it)")
        time.sleep(0.1)


def quoted(argv: list[str]) -> str:
    return shlex.join(argv)
