"""The environment contract of every rank (DESIGN §4), as one pure function so that the
local and Ray backends give scripts exactly the same view, and tests can check it offline."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from batchyard.launchplan import node_mount_relative as node_mount_relative
from batchyard.node.plan import NodePlan

_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def expand(text: str, env: dict[str, str]) -> str:
    """Expand ``$NAME``/``${NAME}`` from ``env`` only (Batch AI expanded its own variables in
    paths service-side); unknown names are left as written."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, match.group(0))

    return _VAR.sub(sub, text)


@dataclass(frozen=True)
class NodeDirs:
    mount_root: Path
    job_mount_root: Path
    job_temp: Path
    shared_job_temp: Path
    workdir: Path
    stdouterr: Path
    outputs: dict[str, Path]
    inputs: dict[str, str]
    hostfile: Path


def _job_suffix(plan: NodePlan) -> Path:
    return Path(plan.workspace, plan.experiment, plan.job_name, plan.attempt_uuid)


# Batch AI's variables that name a directory on the node: it expanded them in every path
# property of a job (stdOutErrPathPrefix, pathPrefix, pathSuffix, an input's path,
# pythonInterpreterPath) on the service side, with or without a container
PATH_VARS = ("AZ_BATCHAI_MOUNT_ROOT", "AZ_BATCHAI_JOB_MOUNT_ROOT", "AZ_BATCHAI_JOB_TEMP",
             "AZ_BATCHAI_SHARED_JOB_TEMP", "BATCHYARD_JOB_DIR", "BATCHYARD_CHECKPOINT_DIR")


def path_vars(plan: NodePlan) -> dict[str, str]:
    """Each of PATH_VARS as this node's directory of the attempt."""
    node_dir = Path(plan.node_dir)
    attempt_dir = Path(plan.attempt_dir)
    job_local = node_dir / "jobs" / f"{plan.job_name}-{plan.attempt_uuid[:8]}"
    return {
        "AZ_BATCHAI_MOUNT_ROOT": str(node_dir / "mounts"),
        "AZ_BATCHAI_JOB_MOUNT_ROOT": str(job_local / "mounts"),
        "AZ_BATCHAI_JOB_TEMP": str(job_local / "tmp"),
        "AZ_BATCHAI_SHARED_JOB_TEMP": str(attempt_dir / "shared"),
        "BATCHYARD_JOB_DIR": str(attempt_dir),
        "BATCHYARD_CHECKPOINT_DIR": plan.checkpoint_dir,
    }


def expand_plan_paths(plan: NodePlan) -> None:
    """The plan's own path properties that the launcher uses as paths (not through a
    shell), with Batch AI's variables expanded: the job's interpreter."""
    if plan.python:
        plan.python = expand(plan.python, path_vars(plan))


def node_dirs(plan: NodePlan) -> NodeDirs:
    node_dir = Path(plan.node_dir)
    attempt_dir = Path(plan.attempt_dir)
    job_local = node_dir / "jobs" / f"{plan.job_name}-{plan.attempt_uuid[:8]}"
    roots = path_vars(plan)
    if plan.stdouterr_path_prefix:
        prefix_dir = Path(expand(plan.stdouterr_path_prefix, roots))
        stdouterr = prefix_dir / _job_suffix(plan) / "stdouterr"
    else:
        stdouterr = attempt_dir / "stdouterr"
    outputs: dict[str, Path] = {}
    for ident, out in plan.outputs.items():
        prefix = out.get("path_prefix")
        base = (
            Path(expand(prefix, roots)) / _job_suffix(plan) / "outputs"
            if prefix
            else attempt_dir / "outputs"
        )
        path = base / ident  # the id as the job spells it, as job file list shows it
        if out.get("path_suffix"):
            path = path / expand(str(out["path_suffix"]), roots)
        outputs[ident] = path
    inputs = {
        ident: str(job_local / "inputs" / ident)
        if spec.get("store") and spec.get("mode") in ("download", "ro_mount")
        else expand(str(spec.get("local_path") or spec.get("path", "")), roots)
        for ident, spec in plan.inputs.items()
    }
    return NodeDirs(
        mount_root=Path(roots["AZ_BATCHAI_MOUNT_ROOT"]),
        job_mount_root=Path(roots["AZ_BATCHAI_JOB_MOUNT_ROOT"]),
        job_temp=Path(roots["AZ_BATCHAI_JOB_TEMP"]),
        shared_job_temp=Path(roots["AZ_BATCHAI_SHARED_JOB_TEMP"]),
        workdir=job_local / "wd",
        stdouterr=stdouterr,
        outputs=outputs,
        inputs=inputs,
        hostfile=attempt_dir / ".batchyard" / "hostfile",
    )


def tf_roles(total: int, ps: int) -> list[tuple[str, int]]:
    """Task (type, index) per rank: rank 0 is the chief, then workers, parameter servers last."""
    workers = total - ps
    roles: list[tuple[str, int]] = [("chief", 0)]
    roles += [("worker", i) for i in range(workers - 1)]
    roles += [("ps", i) for i in range(ps)]
    return roles


def node_env(plan: NodePlan, dirs: NodeDirs) -> dict[str, str]:
    """Variables shared by every process on this node (also the prepare command's env)."""
    ppn = plan.processes_per_node
    env: dict[str, str] = dict(plan.env)
    env.update(plan.secrets)
    master = f"{plan.master_addr}:{plan.master_port}"
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "BATCHYARD_JOB_ID": str(plan.job_id),
            "BATCHYARD_JOB_NAME": plan.job_name,
            "BATCHYARD_WORKSPACE": plan.workspace,
            "BATCHYARD_EXPERIMENT": plan.experiment,
            "BATCHYARD_ATTEMPT": str(plan.attempt),
            "BATCHYARD_NODE_RANK": str(plan.node_rank),
            "BATCHYARD_NODE_NAME": plan.node_name,
            "BATCHYARD_NUM_NODES": str(plan.num_nodes),
            "BATCHYARD_NODE_IPS": "\n".join(plan.node_addrs),
            "BATCHYARD_NODE_NAMES": "\n".join(plan.node_names),
            "BATCHYARD_PROCESSES_PER_NODE": str(ppn),
            "BATCHYARD_CHECKPOINT_DIR": plan.checkpoint_dir,
            "BATCHYARD_JOB_DIR": plan.attempt_dir,
            "BATCHYARD_WORK_DIR": str(dirs.workdir),  # where this node's ranks start
            "BATCHYARD_PROC_TAG": plan.tag,
            "MASTER_ADDR": plan.master_addr,
            "MASTER_PORT": str(plan.master_port),
            "NODE_RANK": str(plan.node_rank),
            "GROUP_RANK": str(plan.node_rank),
            "GROUP_WORLD_SIZE": str(plan.num_nodes),
            "LOCAL_WORLD_SIZE": str(ppn),
            "ROLE_NAME": "default",
            "TORCHELASTIC_RUN_ID": plan.attempt_uuid,
            "TORCHELASTIC_RESTART_COUNT": str(plan.attempt - 1),
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "AZ_BATCHAI_MOUNT_ROOT": str(dirs.mount_root),
            "AZ_BATCHAI_JOB_MOUNT_ROOT": str(dirs.job_mount_root),
            "AZ_BATCHAI_STDOUTERR_DIR": str(dirs.stdouterr),
            "AZ_BATCHAI_JOB_TEMP": str(dirs.job_temp),
            "AZ_BATCHAI_SHARED_JOB_TEMP": str(dirs.shared_job_temp),
            "AZ_BATCHAI_TASK_INDEX": str(plan.node_rank),
            "AZ_BATCHAI_NUM_GPUS": str(len(plan.gpus or [])),
            "AZ_BATCHAI_JOB_NAME": plan.job_name,
            "AZ_BATCH_MASTER_NODE": master,
            "AZUREML_RUN_ID": f"{plan.experiment}_{plan.job_name}",
            "AZUREML_EXPERIMENT_NAME": plan.experiment,
            "AZUREML_NODE_COUNT": str(plan.num_nodes),
        }
    )
    if plan.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in plan.gpus)
    if "CUDA_DEVICE_ORDER" not in plan.env:  # indices as nvidia-smi (and batchyard) count
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if "OMP_NUM_THREADS" not in plan.env:
        env["OMP_NUM_THREADS"] = str(max(1, plan.cpus // ppn))
    if plan.hang_timeout:  # touched by batchyard.heartbeat() and log_metric: progress
        from batchyard.node.watchdog import heartbeat_path

        env["BATCHYARD_HEARTBEAT_FILE"] = str(heartbeat_path(dirs.stdouterr, plan.node_name))
    from batchyard.node.notice import mark_path, notice_path

    env["BATCHYARD_PREEMPT_NOTICE"] = str(notice_path(dirs.stdouterr, plan.node_name))
    env["BATCHYARD_CHECKPOINT_MARK"] = str(mark_path(dirs.stdouterr, plan.node_name))
    if plan.api_url:
        env["BATCHYARD_API"] = plan.api_url
    if plan.api_token:
        env["BATCHYARD_TOKEN"] = plan.api_token
    if plan.ca_file and plan.api_url and plan.api_url.startswith("https:"):
        env["BATCHYARD_CA"] = plan.ca_file  # so the SDK in a rank trusts the server too
    from batchyard.node.tracking import tracking_env

    for key, value in tracking_env(plan).items():  # MLflow's: the job's own setting wins
        if key not in plan.env and key not in plan.secrets:
            env[key] = value
    for ident, path in dirs.outputs.items():
        env[f"BATCHYARD_OUTPUT_{ident}"] = str(path)
        env[f"AZ_BATCHAI_OUTPUT_{ident}"] = str(path)
    for ident, value in dirs.inputs.items():
        env[f"BATCHYARD_INPUT_{ident}"] = value
        env[f"AZ_BATCHAI_INPUT_{ident}"] = value
    kind = plan.dist_type
    if kind == "pytorch":
        backend = plan.distribution.get("backend") or "auto"
        if backend == "auto":
            backend = "nccl" if plan.gpus else "gloo"
        env["BATCHYARD_DIST_BACKEND"] = backend
        # Nodes share no file system: rendezvous over TCP at node 0's address and port.
        env["AZ_BATCHAI_PYTORCH_INIT_METHOD"] = f"tcp://{plan.master_addr}:{plan.master_port}"
    if plan.ifname:
        for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if key not in plan.env:
                env[key] = plan.ifname
    if kind in ("mpi", "custom"):
        # custom covers Batch AI's customMpiSettings: the user's own
        # `mpirun -hostfile $AZ_BATCHAI_MPI_HOST_FILE` must work as batchyard's does, with
        # the job's MPI flavour (Open MPI's OMPI_MCA_*, or Hydra's HYDRA_*/I_MPI_*)
        from batchyard.node.mpi import mpirun_env

        env.update(mpirun_env(plan, dirs.hostfile))
    return env


def rank_env(plan: NodePlan, base: dict[str, str], local_rank: int) -> dict[str, str]:
    """Per-rank additions: global rank ordered by node rank, then local rank."""
    ppn = plan.processes_per_node
    world = plan.world_size
    rank = plan.node_rank * ppn + local_rank
    env = dict(base)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "BATCHYARD_RANK": str(rank),
            "BATCHYARD_LOCAL_RANK": str(local_rank),
            "BATCHYARD_WORLD_SIZE": str(world),
        }
    )
    gpus = plan.gpus or []
    if gpus and ppn > 1 and len(gpus) >= ppn:
        per = len(gpus) // ppn
        mine = gpus[local_rank * per : (local_rank + 1) * per]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in mine)
    if plan.dist_type == "tensorflow":
        env.update(_tf_env(plan, rank, world))
    return env


def _tf_env(plan: NodePlan, rank: int, world: int) -> dict[str, str]:
    ps = int(plan.distribution.get("parameter_server_count") or 0)
    roles = tf_roles(world, ps)
    ppn = plan.processes_per_node
    ports = plan.task_ports or [plan.master_port + 1 + r for r in range(world)]
    hosts = [f"{plan.node_addrs[r // ppn]}:{ports[r]}" for r in range(world)]
    cluster: dict[str, list[str]] = {}
    for r, (kind, _index) in enumerate(roles):
        cluster.setdefault(kind, []).append(hosts[r])
    kind, index = roles[rank]
    worker_hosts = cluster.get("chief", []) + cluster.get("worker", [])
    # Batch AI's recipes number workers with the master as worker 0 (--task_index).
    batchai_index = index + 1 if kind == "worker" else index
    return {
        "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": kind, "index": index}, "environment": "cloud"}
        ),
        "AZ_BATCHAI_WORKER_HOSTS": ",".join(worker_hosts),
        "AZ_BATCHAI_PS_HOSTS": ",".join(cluster.get("ps", [])),
        "AZ_BATCHAI_TASK_TYPE": kind,
        "AZ_BATCHAI_TASK_INDEX": str(batchai_index),
    }


def tf_role_of(plan: NodePlan, local_rank: int) -> str:
    ps = int(plan.distribution.get("parameter_server_count") or 0)
    world = plan.world_size
    return tf_roles(world, ps)[plan.node_rank * plan.processes_per_node + local_rank][0]


# What `python`, `python3` and `pip` run on a job's ranks: the job's interpreter, however the
# PATH a rank gets is built (Open MPI's mpirun, called by its absolute path, puts its own bin
# first on its ranks' PATH; RANK_SHIM puts BATCHYARD_JOB_BIN back in front).
_PYTHON_SHIMS = {"python": "", "python3": "", "pip": " -m pip", "pip3": " -m pip"}


def job_python_env(plan: NodePlan, dirs: NodeDirs, target: Path,
                   host_path: str) -> dict[str, str]:
    """PATH and PYTHONPATH for a job on the host: a bin dir of shims for ``target`` first,
    then ``target``'s own dir (a virtualenv's tools), then the host's PATH; and the azureml
    shim (node/pyshim.py) first on PYTHONPATH, for the ranks only."""
    from batchyard.node.pyshim import write_pyshim

    bindir = dirs.job_temp / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name, extra in _PYTHON_SHIMS.items():
        shim = bindir / name
        shim.write_text(f'#!/bin/sh\nexec "{target}"{extra} "$@"\n')
        shim.chmod(0o755)
    shimdir = write_pyshim(dirs.job_temp / "pyshim")
    user = plan.env.get("PYTHONPATH") or _user_pythonpath()
    return {"PATH": f"{bindir}{os.pathsep}{target.parent}{os.pathsep}{host_path}",
            "BATCHYARD_JOB_BIN": str(bindir),
            "PYTHONPATH": str(shimdir) + (os.pathsep + user if user else "")}


def _user_pythonpath() -> str | None:
    """The PYTHONPATH the user gave the server (the launcher's own is batchyard's)."""
    if "BATCHYARD_LAUNCHER" in os.environ:
        return os.environ.get("BATCHYARD_USER_PYTHONPATH")
    return os.environ.get("PYTHONPATH")


def merged_environ(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without batchyard's own variables (the server's admin
    token and home must never reach user code), with ``extra`` on top."""
    env = dict(os.environ)
    user_path = env.get("BATCHYARD_USER_PYTHONPATH")
    if "BATCHYARD_LAUNCHER" in env:
        env.pop("PYTHONPATH", None)
        if user_path:
            env["PYTHONPATH"] = user_path
    # (MLflow's too: a job's come from its plan, node/tracking.py, never the machine's)
    for key in [k for k in env if k.startswith(("BATCHYARD_", "AZ_BATCHAI_", "OMPI_",
                                                "MLFLOW_"))]:
        del env[key]
    # Inside a Slurm job: Open MPI takes SLURM_NODELIST for "started by srun" and refuses to
    # start a singleton (mpi4py in a preparation step); SLURM_JOB_NODELIST says the same.
    env.pop("SLURM_NODELIST", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the server's /metrics files, not the job's
    env.update(extra)
    return env
