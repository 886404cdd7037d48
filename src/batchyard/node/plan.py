"""The launch plan a backend writes for one node of one attempt (JSON, mode 0600 since it
carries secrets and the job token), and where that attempt's control and status files live."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


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
    code_archive: str | None = None
    python: str | None = None
    gpus: list[int] | None = None
    cpus: int = 1
    api_url: str | None = None
    api_token: str | None = None
    max_wall_clock: float | None = None
    grace_period: float = 30.0
    rsh_agent: list[str] | None = None
    storage_sync: float | None = None  # seconds between output syncs to storage

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

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self), mode=0o600)

    @classmethod
    def load(cls, path: Path) -> NodePlan:
        return cls(**json.loads(path.read_text()))


@dataclass(frozen=True)
class AttemptPaths:
    """Files through which the server and the launchers talk, all under the attempt dir."""

    root: Path

    @property
    def control(self) -> Path:
        return self.root / ".batchyard"

    def plan(self, node_rank: int) -> Path:
        return self.control / f"node-{node_rank}.plan.json"

    def status(self, node_rank: int) -> Path:
        return self.control / f"node-{node_rank}.status.json"

    def started(self, node_rank: int) -> Path:
        return self.control / f"node-{node_rank}.started"

    @property
    def cancel(self) -> Path:
        return self.control / "cancel.json"

    @property
    def abort(self) -> Path:
        return self.control / "abort.json"

    @property
    def finish(self) -> Path:
        return self.control / "finish"

    @property
    def stdouterr(self) -> Path:
        return self.root / "stdouterr"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"


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
