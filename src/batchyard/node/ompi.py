"""Open MPI's side of an MPI gang: node 0's mpirun line, the MCA parameters a user's own
mpirun gets as environment, and each node's own shared-memory directory.

No btl list is forced (``--mca btl self,tcp`` broke one-sided windows, ``MPI_ERR_WIN``):
Open MPI keeps its shared memory (vader) and its osc components, and only TCP is pointed at
the nodes' network (``btl_tcp_if_include``, ``oob_tcp_if_include``). Two more things follow:

* One-sided communication between nodes. Open MPI 4.1's osc/rdma needs RDMA-capable
  transports (TCP is not one: 5.0 added emulation) and osc/pt2pt refuses
  ``MPI_THREAD_MULTIPLE`` (mpi4py's default), so over TCP only osc/ucx can open a window
  that spans nodes, and it runs on pml/ucx. Debian excludes both (``pml = ^ucx``,
  ``osc = ^ucx,pt2pt`` in openmpi-mca-params.conf) and Open MPI enables UCX only on
  InfiniBand devices. A multi-node gang therefore gets every pml and osc component back
  (empty lists: an Open MPI without UCX simply keeps ob1) and UCX allowed on any transport,
  so pml/ucx runs when it can and ob1 when it cannot, on every node alike.
* Virtual nodes sharing one machine each see themselves as a separate host of the same
  name, so the vader segments of their ranks (``vader_segment.<host>.<job>.<local rank>``)
  would collide: each node's daemon gets its own backing directory (``node_mca_env``).

The job's ``mpi.mca`` is applied last and wins; ``mpi.extra_args`` come after batchyard's
arguments on the line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from batchyard.node.plan import NodePlan

# a multi-node gang: all of Open MPI's pml and osc components, UCX on any transport
ONE_SIDED = {"pml": "", "osc": "", "opal_common_ucx_tls": "any",
             "opal_common_ucx_devices": "any"}
# mpirun options batchyard sets from the job: extra_args may not give them again
OWNED_OPTIONS = ("-np", "-n", "-c", "--np", "-hostfile", "--hostfile", "-machinefile",
                 "--machinefile", "-H", "-host", "--host", "--default-hostfile")
# MCA parameters the relay depends on
OWNED_MCA = ("plm_rsh_agent", "orte_rsh_agent", "plm", "pls_rsh_agent")
MCA_NAME = re.compile(r"^[a-z][a-z0-9_]{0,127}$")


def shared_host(plan: NodePlan) -> bool:
    return len(set(plan.node_addrs)) < plan.num_nodes


def shared_host_slots(plan: NodePlan) -> int:
    """Ranks that will share this machine's cores (virtual nodes on one host)."""
    same_host = sum(1 for addr in plan.node_addrs if addr == plan.node_addrs[plan.node_rank])
    return same_host * plan.processes_per_node


def if_include(plan: NodePlan) -> str | None:
    """Where Open MPI may talk: loopback between virtual nodes, else the network that carries
    the nodes' addresses (a subnet, since interface names may differ between machines)."""
    if all(addr.startswith("127.") for addr in plan.node_addrs):
        return "lo"
    return plan.subnet


def job_mca(plan: NodePlan) -> dict[str, str]:
    """The job's own ``mpi.mca`` (the plan carries it in its distribution)."""
    return {str(k): str(v) for k, v in (plan.distribution.get("mpi_mca") or {}).items()}


def mca_params(plan: NodePlan) -> dict[str, str]:
    """Every MCA parameter of node 0's mpirun line, in the order it gives them."""
    params = {"rtc_hwloc_vmhole": "none"}
    # (several orteds on one host race to map hwloc's shared topology into a "hole" of
    # their address space and one can segfault, seen here ~1 launch in 20: don't share it)
    if shared_host_slots(plan) > (os.cpu_count() or 1):
        # more ranks than cores: busy-polling ranks would starve each other (5x slower)
        params["mpi_yield_when_idle"] = "1"
    if plan.rsh_agent:
        params.update({"plm": "rsh", "plm_rsh_agent": " ".join(plan.rsh_agent)})
    if "SLURM_JOB_ID" in os.environ:
        # inside a Slurm job Open MPI would take its hosts from Slurm's variables and start
        # its daemons with srun: the gang's hostfile and the relay decide instead
        params["ras"] = "^slurm"
    include = if_include(plan)
    if include:
        params.update({"btl_tcp_if_include": include, "oob_tcp_if_include": include})
    if plan.num_nodes > 1:
        params.update(ONE_SIDED)
    params.update(job_mca(plan))
    return params


def openmpi_argv(plan: NodePlan, mpirun: str, hostfile: str, nprocs: int) -> list[str]:
    argv = [mpirun]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["--oversubscribe", "-np", str(nprocs), "--hostfile", hostfile,
             "--bind-to", "none"]
    for key, value in mca_params(plan).items():
        argv += ["--mca", key, value]
    return argv


def mca_env(plan: NodePlan) -> dict[str, str]:
    """What the mpirun line passes that a user's own mpirun needs too, as environment:
    running as root, the network, one-sided across nodes and the job's ``mpi.mca``. A
    variable the job sets itself wins."""
    env: dict[str, str] = {}
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_rtc_hwloc_vmhole"] = "none"
    include = if_include(plan)
    if include:
        env["OMPI_MCA_btl_tcp_if_include"] = env["OMPI_MCA_oob_tcp_if_include"] = include
    if plan.num_nodes > 1:
        env.update({f"OMPI_MCA_{k}": v for k, v in ONE_SIDED.items()})
    env.update({f"OMPI_MCA_{k}": v for k, v in job_mca(plan).items()})
    env.update(ucx_env(plan))
    return {key: value for key, value in env.items() if key not in plan.env}


def ucx_env(plan: NodePlan) -> dict[str, str]:
    """UCX (pml/ucx, osc/ucx) on this node: over the node's own interface, and only TCP
    between containers of one machine, which share its hostname (so UCX takes them for one
    host) but neither a PID namespace nor /dev/shm."""
    if plan.num_nodes < 2:
        return {}
    env: dict[str, str] = {}
    if plan.ifname and plan.ifname != "lo":
        env["UCX_NET_DEVICES"] = plan.ifname
    if shared_host(plan) and (plan.container or {}).get("image"):
        env["UCX_TLS"] = "self,tcp"
    return env


def node_mca_env(plan: NodePlan, session_base: Path) -> dict[str, str]:
    """What a relayed Open MPI daemon on this node passes on to its ranks so that they do
    not collide with another node's on a shared machine: its own session directory (two
    orteds racing to create one under /tmp, one failing with EEXIST, was seen ~1 run in 100)
    and shared-memory backing files. mpirun forwards its own OMPI_* variables over a
    daemon's, so none of these is ever set in mpirun's environment. In a container /tmp and
    /dev/shm are the container's own already."""
    if not shared_host(plan) or (plan.container or {}).get("image"):
        return {}
    env = {"OMPI_MCA_orte_tmpdir_base": str(session_base),
           "OMPI_MCA_btl_vader_backing_directory": str(session_base),
           "OMPI_MCA_osc_rdma_backing_directory": str(session_base)}
    own = set(plan.env) | {f"OMPI_MCA_{k}" for k in job_mca(plan)}
    return {key: value for key, value in env.items() if key not in own}
