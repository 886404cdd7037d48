"""The one typed launch plan of one node of one attempt: built once by the server from the
job's spec, rendered by dry runs from the same object, sent to the node as JSON over the node
channel and parsed back into this model by the launcher. Standard library only: the launcher
imports it under ``python -S``.

The plan never names a path on the server: every directory in it lives under the node's own
work dir, because the server and a node share no disk."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# Ports are chosen on the nodes themselves (free there, not on the server host) and published
# through the server before any rank starts; a plan carries 0 until then.
PORT_FROM_RENDEZVOUS = 0


@dataclass
class NodePlan:
    job_id: int
    job_name: str
    workspace: str
    experiment: str
    attempt: int
    attempt_uuid: str
    node_rank: int
    node_names: list[str]
    node_addrs: list[str]
    distribution: dict[str, Any]
    command: str | list[str] | None
    prepare: str | list[str] | None
    attempt_dir: str
    node_dir: str
    checkpoint_dir: str
    master_addr: str
    master_port: int
    task_ports: list[int] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    stdouterr_path_prefix: str | None = None
    code_archive: str | None = None  # a snapshot id (sha256), fetched from the server
    python: str | None = None
    gpus: list[int | str] | None = None  # CUDA_VISIBLE_DEVICES ids: indices, or UUIDs
    cpus: int = 1
    api_url: str | None = None
    api_token: str | None = None
    max_wall_clock: float | None = None
    grace_period: float = 30.0
    checkpoint_signal: str = "SIGUSR1"  # the preemption notice's signal ("none": no signal)
    rsh_agent: list[str] | None = None
    storage_sync: float | None = None  # seconds between output syncs to storage
    ifname: str | None = None  # the interface carrying this node's address (set on the node)
    subnet: str | None = None  # node 0's network (a.b.c.d/len), for Open MPI's if_include
    ca_file: str | None = None  # the CA this node trusts the server with (ranks get it too)
    # image, registry (server, username, password), pull_policy, shm_size: the job runs in a
    # container of that image on this node (node/container.py)
    container: dict[str, Any] | None = None
    # Debugging (issue 15): seconds without progress before the watchdog dumps stacks, what
    # it does then (dump|fail|requeue), and the pre-flight checks of a multi-node gang.
    hang_timeout: float | None = None
    on_hang: str = "dump"
    preflight: str | None = None
    keep_alive_on_failure: float | None = None  # seconds a failed gang stays for job exec
    # Observability (issue 38): where ranks log MLflow calls (node/tracking.py), and how the
    # launcher samples GPUs and when it calls them idle (node/gpu_usage.py)
    mlflow: dict[str, Any] | None = None
    observe: dict[str, Any] | None = None
    # Isolation (issue 32): whose job it is (its processes run as that user's own uid on a
    # bare node), whether its cluster allows root jobs, its limits per node, and the
    # server's own folders and credentials to hide from it (node/sandbox.py).
    job_user: str | None = None
    allow_root: bool = False
    max_pids: int | None = None
    max_output: int | None = None
    hide: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)  # beneath those: its workspace's datastores

    @property
    def node_name(self) -> str:
        return self.node_names[self.node_rank]

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    @property
    def processes_per_node(self) -> int:
        return int(self.distribution.get("processes_per_node") or 1)

    @property
    def world_size(self) -> int:
        """Ranks in the gang; ``process_count`` allows uneven layouts (e.g. 3 TF tasks on 2
        nodes: the last node starts fewer). A custom job is one process on the master node."""
        if self.dist_type == "custom":
            return 1
        count = self.distribution.get("process_count")
        return int(count) if count else self.num_nodes * self.processes_per_node

    @property
    def dist_type(self) -> str:
        return str(self.distribution.get("type") or "pytorch")

    @property
    def tag(self) -> str:
        """Carried in every process's environment so that stragglers can be found and killed."""
        return f"{self.attempt_uuid}/{self.node_rank}"

    def ports_wanted(self) -> int:
        """Ports this node must publish: the master port (node 0) and one per TF task."""
        if self.dist_type != "tensorflow":
            return 1
        return 1 + self.processes_per_node

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodePlan:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: Path, mask_registry: bool = False) -> None:
        """``mask_registry``: the copy kept in the attempt dir, which a job's processes (and
        other jobs' on the node) could read, holds no secret: job secrets, the job token,
        storage credentials and the registry password are masked. The launcher keeps the
        plan in memory and hands helpers theirs on a pipe (node/staging.py)."""
        data = masked(asdict(self)) if mask_registry else asdict(self)
        write_json_atomic(path, data, mode=0o600)

    @classmethod
    def load(cls, path: Path) -> NodePlan:
        return cls.from_dict(json.loads(path.read_text()))


@dataclass
class Ticket:
    """What a backend hands a node to start its launcher: where the server is (as this node
    reaches it), how to trust it, and a credential that acts for this one (attempt, node)
    and nothing else. Written mode 0600 on the node; never put in an environment."""

    server: str
    token: str
    attempt: str
    node_rank: int
    node_dir: str
    ca_file: str | None = None
    # the other servers of the database (a standby takes over when the leader dies), and
    # the home's address file of a server on this node's machine (it may come back on
    # another port): where the launcher looks when its server stops answering
    servers: list[str] = field(default_factory=list)
    home_file: str | None = None
    # the allocation a queueing backend started this node in, as the node sees it (Slurm: its
    # step's SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURMD_NODENAME): sent with the plan request,
    # it tells the server where the gang started without asking the queue
    allocation: dict[str, str] | None = None

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self), mode=0o600)

    @classmethod
    def load(cls, path: Path) -> Ticket:
        data = json.loads(path.read_text())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


MASK = "***"


def masked(data: dict[str, Any]) -> dict[str, Any]:
    """A plan's dict with every secret value replaced (the keys stay: they say what was
    given)."""
    out = json.loads(json.dumps(data))
    out["secrets"] = {k: MASK for k in out.get("secrets") or {}}
    if out.get("api_token"):
        out["api_token"] = MASK
    for item in (*(out.get("mounts") or []), *(out.get("inputs") or {}).values(),
                 *(out.get("outputs") or {}).values()):
        store = item.get("store") or {}
        if store.get("credentials"):
            store["credentials"] = {k: MASK for k in store["credentials"]}
        if item.get("account_key"):
            item["account_key"] = MASK
    registry = (out.get("container") or {}).get("registry") or {}
    if registry.get("password"):
        registry["password"] = MASK
    return out


def node_attempt_dir(node_dir: str, workspace: str, experiment: str, job: str,
                     attempt_uuid: str) -> Path:
    """Batch AI's layout, under the node's own work dir."""
    return Path(node_dir, "workspaces", workspace, "experiments", experiment, "jobs", job,
                attempt_uuid)


def ticket_path(node_dir: str, attempt_uuid: str, node_rank: int) -> Path:
    return Path(node_dir, "tickets", f"{attempt_uuid}.{node_rank}.json")


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


# What a launcher's report carries that changes with every usage sample (node/usage.py, about
# every 2 s) and that nothing waits on: a report whose other keys are unchanged is no news.
SAMPLED = frozenset(("util", "scrape", "gpu", "updated_at"))


def report_news(before: dict[str, Any] | None, after: dict[str, Any]) -> bool:
    """Whether a launcher's report says something besides a new usage sample."""
    if before is None:
        return True
    keys = (before.keys() | after.keys()) - SAMPLED
    return any(before.get(k) != after.get(k) for k in keys)


def container_report(found: dict[str, Any]) -> dict[str, Any] | None:
    """What the server keeps of a node's container report (``node.container.describe``):
    {} means no runtime. Here, not in ``node/``: the server reads it from heartbeats and
    launcher reports, and learns about nodes only over the node channel."""
    return {k: found.get(k) for k in ("runtime", "version", "images")} if found else None


def node_mount_relative(name: str) -> str:
    """A node-wide mount point, ``$AZ_BATCHAI_MOUNT_ROOT/<name>`` (Batch AI's cluster mounts,
    e.g. auto storage), as a mount's relative_path, which is relative to the job's
    ``$AZ_BATCHAI_JOB_MOUNT_ROOT`` (``<node>/jobs/<job>/mounts``; node/env.py node_dirs)."""
    return f"../../../mounts/{name}"
