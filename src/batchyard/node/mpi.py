"""The mpirun line node 0 runs for an MPI gang: a hostfile of node names (never addresses:
local nodes share 127.0.0.1 and Open MPI rejects a host listed twice) and the batchyard rsh
agent in place of ssh."""

from __future__ import annotations

import os
import shlex
import shutil

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
    argv += ["--bind-to", "none", "--mca", "btl", "self,vader,tcp"]
    if plan.rsh_agent:
        argv += ["--mca", "plm_rsh_agent", " ".join(plan.rsh_agent)]
    if all(addr.startswith("127.") for addr in plan.node_addrs):
        argv += ["--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
    argv += [str(a) for a in dist.get("mpirun_args") or []]
    command = plan.command
    if isinstance(command, list):
        argv += command
    elif command:
        argv += ["bash", "-c", command]
    return argv


def quoted(argv: list[str]) -> str:
    return shlex.join(argv)
