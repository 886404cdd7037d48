"""The mpirun line node 0 runs for an MPI gang: a hostfile of node names (never addresses:
local nodes share 127.0.0.1 and Open MPI rejects a host listed twice) and the batchyard rsh
agent in place of ssh."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from batchyard.node.env import node_dirs
from batchyard.node.plan import NodePlan


def mpirun_argv(plan: NodePlan) -> list[str]:
    dist = plan.distribution
    nprocs = int(dist.get("process_count") or plan.num_nodes * plan.processes_per_node)
    dirs = node_dirs(plan)
    argv = [shutil.which("mpirun") or "mpirun"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["--oversubscribe", "-np", str(nprocs), "--hostfile", str(dirs.hostfile)]
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
    argv += [str(a) for a in dist.get("mpirun_args") or []]
    command = plan.command
    user = shlex.join(command) if isinstance(command, list) else str(command or "")
    argv += ["bash", "-c", RANK_SHIM, "batchyard-mpi-rank", user]
    return argv


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
# code behind so a failure can name the rank rather than just "mpirun failed".
RANK_SHIM = (
    'd="$AZ_BATCHAI_STDOUTERR_DIR"; r="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"; '
    'f="$d/${BATCHYARD_NODE_NAME}-rank$r"; '
    'bash -c "$1" >>"$f.stdout.txt" 2>>"$f.stderr.txt"; rc=$?; '
    'mkdir -p "$BATCHYARD_JOB_DIR/.batchyard/mpi"; '
    'echo "$rc $BATCHYARD_NODE_NAME" > "$BATCHYARD_JOB_DIR/.batchyard/mpi/rank-$r.exit"; '
    'exit $rc'
)


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
