"""Gang -> one NodePlan per node, the only place the launch plan is built (every backend and
the node channel's plan endpoint call this, so every backend gives ranks the same view)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchyard.backends.base import Gang
from batchyard.launchplan import PORT_FROM_RENDEZVOUS, NodePlan, node_attempt_dir
from batchyard.spec.cluster import DEFAULT_OUTPUT, DEFAULT_PIDS


def build_plans(gang: Gang) -> list[NodePlan]:
    spec = gang.spec
    dist = dict(spec.get("distribution") or {})
    limits = spec.get("limits") or {}
    mpi = spec.get("mpi") or {}
    if mpi.get("flavour"):
        dist["mpi_flavour"] = mpi["flavour"]
    if mpi.get("mca"):
        dist["mpi_mca"] = dict(mpi["mca"])
    if mpi.get("extra_args"):
        dist["mpi_extra_args"] = list(mpi["extra_args"])
    pids = int(gang.cluster_spec.get("max_pids") or DEFAULT_PIDS)
    plans = []
    for rank, node in enumerate(gang.nodes):
        attempt_dir = node_attempt_dir(node.directory, gang.workspace, gang.experiment,
                                       gang.job_name, gang.attempt_uuid)
        plans.append(NodePlan(
            job_id=gang.job_id, job_name=gang.job_name, workspace=gang.workspace,
            experiment=gang.experiment, attempt=gang.attempt, attempt_uuid=gang.attempt_uuid,
            node_rank=rank, node_names=[n.name for n in gang.nodes],
            node_addrs=[n.address for n in gang.nodes], distribution=dist,
            command=spec.get("command"), prepare=spec.get("prepare"),
            attempt_dir=str(attempt_dir), node_dir=node.directory,
            checkpoint_dir=str(Path(attempt_dir).parent / "checkpoints"),
            master_addr=gang.nodes[0].address, master_port=PORT_FROM_RENDEZVOUS,
            env=dict(spec.get("env") or {}), secrets=dict(spec.get("secrets") or {}),
            outputs=dict(spec.get("outputs") or {}), inputs=dict(spec.get("inputs") or {}),
            mounts=list(spec.get("mounts") or []),
            stdouterr_path_prefix=spec.get("stdouterr_path_prefix"),
            code_archive=gang.code_archive,
            python=(spec.get("environment") or {}).get("python"),
            gpus=list(node.resources.get("gpu_ids") or []) or None,
            cpus=int(node.resources.get("cpus") or 1),
            api_url=gang.api_url, api_token=gang.api_token,
            max_wall_clock=limits.get("max_wall_clock"),
            grace_period=float(limits.get("grace_period", 30.0)),
            checkpoint_signal=str(limits.get("checkpoint_signal") or "SIGUSR1"),
            storage_sync=spec.get("storage_sync"),
            container=container_of(spec),
            hang_timeout=limits.get("hang_timeout") or gang.cluster_spec.get("hang_timeout"),
            on_hang=str(limits.get("on_hang") or "dump"),
            preflight=preflight_of(spec, gang.cluster_spec, len(gang.nodes),
                                   any(n.resources.get("gpu_ids") for n in gang.nodes)),
            keep_alive_on_failure=limits.get("keep_alive_on_failure"),
            mlflow=spec.get("mlflow"), observe=spec.get("observe"),
            job_user=gang.created_by or default_job_user(),
            allow_root=bool(gang.cluster_spec.get("allow_root_jobs")),
            max_pids=min(int(limits.get("max_pids") or pids), pids),
            max_output=int(limits.get("max_output") or gang.cluster_spec.get("max_output")
                           or DEFAULT_OUTPUT),
            hide=list(gang.hidden), shared=list(gang.shared),
        ))
    return plans


def default_job_user() -> str:
    """Whose uid a job with no known submitter runs as: the server's own OS user's name
    (not its uid: node/jobuser.py gives every name an unprivileged uid of its own)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "batchyard"


def container_of(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The job's image and how to pull it; the password is a job secret's value when the
    registry names one (password_secret)."""
    environment = spec.get("environment") or {}
    image = environment.get("image")
    if not image:
        return None
    registry = dict(environment.get("registry") or {}) or None
    if registry and registry.get("password_secret"):
        secret = (spec.get("secrets") or {}).get(registry["password_secret"])
        registry["password"] = secret
    return {"image": image, "registry": registry,
            "pull_policy": environment.get("pull_policy") or "if_missing",
            "shm_size": environment.get("shm_size")}


def preflight_of(spec: dict[str, Any], cluster_spec: dict[str, Any], nodes: int,
                 gpus: bool = False) -> str | None:
    """The job's checks, else the cluster's default; "none" has none. A single node has no
    pair to probe: only its GPUs are checked (when it has any)."""
    chosen = spec.get("preflight") or cluster_spec.get("preflight")
    if not chosen or chosen == "none":
        return None
    if nodes < 2:
        return "gpu" if chosen in ("gpu", "all") and gpus else None
    return str(chosen)
