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
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchyard.node import hydra
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
        argv = _openmpi_argv(plan, mpirun)
    argv += [str(a) for a in plan.distribution.get("mpirun_args") or []]
    shim = HYDRA_RANK_SHIM if flavour in hydra.FLAVOURS else RANK_SHIM
    argv += ["bash", "-c", shim, "batchyard-mpi-rank", user]
    return argv


def _openmpi_argv(plan: NodePlan, mpirun: str) -> list[str]:
    dirs = node_dirs(plan)
    argv = [mpirun]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["--oversubscribe", "-np", str(process_count(plan)), "--hostfile",
             str(dirs.hostfile)]
    argv += ["--bind-to", "none"]
    # Several orteds on one host race to map hwloc's shared topology into a "hole" of their
    # address space and one can segfault (seen here ~1 launch in 20): don't share it.
    argv += ["--mca", "rtc_hwloc_vmhole", "none"]
    if shared_host_slots(plan) > (os.cpu_count() or 1):
        # More ranks than cores: busy-polling ranks would starve each other (5x slower).
        argv += ["--mca", "mpi_yield_when_idle", "1"]
    if plan.rsh_agent:
        argv += ["--mca", "plm", "rsh", "--mca", "plm_rsh_agent", " ".join(plan.rsh_agent)]
    if "SLURM_JOB_ID" in os.environ:
        # Inside a Slurm job Open MPI would take its hosts from Slurm's variables and start
        # its daemons with srun: the gang's hostfile and the relay decide instead.
        argv += ["--mca", "ras", "^slurm"]
    shared_host = len(set(plan.node_addrs)) < plan.num_nodes
    # Virtual nodes on one machine share its hostname, so their shared-memory segments would
    # collide (vader crashes): across such nodes only TCP over loopback is safe.
    argv += ["--mca", "btl", "self,tcp" if shared_host else "self,vader,tcp"]
    include = if_include(plan)
    if include:
        argv += ["--mca", "btl_tcp_if_include", include, "--mca", "oob_tcp_if_include", include]
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
    env.update(mca_env(plan))
    return env


def mca_env(plan: NodePlan) -> dict[str, str]:
    """What mpirun_argv passes on its command line that a user's own mpirun needs too, as
    environment: running as root, and TCP over loopback only between virtual nodes."""
    env: dict[str, str] = {}
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    shared_host = len(set(plan.node_addrs)) < plan.num_nodes
    env["OMPI_MCA_btl"] = "self,tcp" if shared_host else "self,vader,tcp"
    env["OMPI_MCA_rtc_hwloc_vmhole"] = "none"
    include = if_include(plan)
    if include:
        for key in ("OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include"):
            if key not in plan.env:
                env[key] = include
    return env


def if_include(plan: NodePlan) -> str | None:
    """Where Open MPI may talk: loopback between virtual nodes, else the network that carries
    the nodes' addresses (a subnet, since interface names may differ between machines)."""
    if all(addr.startswith("127.") for addr in plan.node_addrs):
        return "lo"
    return plan.subnet


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


def shared_host_slots(plan: NodePlan) -> int:
    """Ranks that will share this machine's cores (virtual nodes on one host)."""
    same_host = sum(1 for addr in plan.node_addrs if addr == plan.node_addrs[plan.node_rank])
    return same_host * plan.processes_per_node


def quoted(argv: list[str]) -> str:
    return shlex.join(argv)
