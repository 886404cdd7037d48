"""Hydra, the process manager of MPICH and of Intel MPI, started without ssh: its rsh
launcher runs the batchyard relay agent (``-launcher rsh -launcher-exec AGENT``; Intel MPI
also reads ``I_MPI_HYDRA_BOOTSTRAP``/``_EXEC``), which hands each proxy's command
(``AGENT HOST "/path/hydra_pmi_proxy" --control-port ...``, or Intel's
``hydra_bstrap_proxy ...``) to that node's launcher. Every proxy then connects back over TCP
to mpiexec on node 0, at the address of the interface given with ``-iface`` (``lo`` between
the virtual nodes of one machine; otherwise the interface that carries node 0's address, since
a Debian hostname resolves to 127.0.1.1).

What differs from Open MPI, and why the options below:

- Hydra passes mpiexec's whole environment to every rank, over what the rank's own node set
  (its node name, directories, process tag, GPUs): ``-genvnone`` (MPICH: ``HYDRA_ENV=none``)
  keeps each node's, which its launcher gave the proxy.
- Its hostfile is ``name:slots``; Intel MPI's ``-f`` ignores the slots (``-ppn`` /
  ``I_MPI_PERHOST`` decide), so both get the per-node count explicitly.
- Intel MPI pins ranks to cores by default: virtual nodes on one machine would pin theirs to
  the same cores. Above 127 nodes it starts proxies from other proxies (a launch tree), which
  would run the agent of node 0 on another node: the tree is kept flat.

A user's own ``mpiexec`` (a custom job whose command runs ``mpirun -f
$AZ_BATCHAI_MPI_HOST_FILE ...``) gets the same as environment, except ``-genvnone`` under
Intel MPI, which has no variable for it: such a line should pass it. Inside a Slurm job, Hydra
is told to take its hosts from the hostfile, not from Slurm (``-rmk user``).
"""

from __future__ import annotations

import os

from batchyard.node.plan import NodePlan

FLAVOURS = ("mpich", "intelmpi")


def iface(plan: NodePlan) -> str | None:
    """This node's interface (mpiexec runs on node 0), where Hydra's proxies connect."""
    if plan.ifname:
        return plan.ifname
    if all(addr.startswith("127.") for addr in plan.node_addrs):
        return "lo"
    return None


def shared_host(plan: NodePlan) -> bool:
    return len(set(plan.node_addrs)) < plan.num_nodes


def agent(plan: NodePlan) -> str | None:
    """The relay agent as Hydra runs it: one executable (Hydra execs the path itself)."""
    return " ".join(plan.rsh_agent) if plan.rsh_agent else None


def mpiexec_argv(plan: NodePlan, mpiexec: str, hostfile: str, nprocs: int) -> list[str]:
    """mpiexec's options up to the command (RANK_SHIM and the user's command follow): the
    same for both flavours, as Intel MPI takes MPICH's option names."""
    argv = [mpiexec]
    relay = agent(plan)
    if relay:
        argv += ["-launcher", "rsh", "-launcher-exec", relay]
    argv += ["-f", hostfile, "-n", str(nprocs), "-ppn", str(plan.processes_per_node)]
    argv += ["-genvnone", "-wdir", "/"]
    where = iface(plan)
    if where:
        argv += ["-iface", where]
    if "SLURM_JOB_ID" in os.environ:
        # Inside a Slurm job Hydra would take its hosts from Slurm: the gang's decide
        argv += ["-rmk", "user"]
    return argv


def user_env(plan: NodePlan, hostfile: str) -> dict[str, str]:
    """The variables that make a user's plain ``mpiexec``/``mpirun`` (MPICH or Intel MPI:
    both sets, so an image that differs from the detected flavour still works) use the relay,
    the hostfile and the right interface. A variable the job sets itself wins."""
    env: dict[str, str] = {}
    relay = agent(plan)
    if relay:
        env.update({"HYDRA_LAUNCHER": "rsh", "HYDRA_LAUNCHER_EXEC": relay,
                    "I_MPI_HYDRA_BOOTSTRAP": "rsh", "I_MPI_HYDRA_BOOTSTRAP_EXEC": relay})
    env.update({"HYDRA_HOST_FILE": hostfile, "I_MPI_HYDRA_HOST_FILE": hostfile,
                "HYDRA_ENV": "none", "I_MPI_PERHOST": str(plan.processes_per_node),
                "I_MPI_HYDRA_BRANCH_COUNT": "-1"})
    where = iface(plan)
    if where:
        env["HYDRA_IFACE"] = env["I_MPI_HYDRA_IFACE"] = where
    if shared_host(plan):
        env["I_MPI_PIN"] = "0"
        if (plan.container or {}).get("image"):
            # Virtual nodes of one machine in containers share a hostname but neither a PID
            # namespace nor /dev/shm: MPICH/UCX (and Intel MPI) shared memory between them
            # fails, so they talk TCP, as Open MPI's btl does between virtual nodes.
            env.update({"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "self,tcp",
                        "I_MPI_FABRICS": "ofi"})
    if "SLURM_JOB_ID" in os.environ:
        env["HYDRA_RMK"] = env["I_MPI_HYDRA_RMK"] = "user"
    return {key: value for key, value in env.items() if key not in plan.env}
