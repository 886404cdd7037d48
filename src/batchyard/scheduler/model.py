"""Plain, immutable views the reconciler builds from the store for one scheduling pass."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class NodeView:
    id: int
    cluster_id: int
    name: str
    state: str  # preparing | idle | running | leaving | unusable | preempted
    job_id: int | None = None
    idle_since: float | None = None

    @property
    def free(self) -> bool:
        return self.state == "idle" and self.job_id is None


@dataclass(frozen=True, slots=True)
class ClusterView:
    id: int
    name: str
    workspace_id: int
    family: str
    vcpus_per_node: int
    gpus_per_node: int
    autoscale: bool = False
    min_nodes: int = 0
    max_nodes: int = 0
    target_nodes: int = 0
    idle_seconds_before_scaledown: float = 1800.0


@dataclass(frozen=True, slots=True)
class JobView:
    id: int
    cluster_id: int
    workspace_id: int
    nodes: int
    processes_per_node: int
    priority: int  # 0 low, 1 normal, 2 high
    seq: int  # submit order: lower was submitted first
    wall_clock: float | None = None


@dataclass(frozen=True, slots=True)
class RunningJobView:
    id: int
    cluster_id: int
    node_ids: tuple[int, ...]
    started_at: float
    wall_clock: float | None = None


@dataclass(frozen=True, slots=True)
class QuotaView:
    workspace_id: int
    family: str
    vcpu_limit: int | None  # None: unlimited
    vcpu_used: int
    gpu_limit: int | None = None
    gpu_used: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    clusters: dict[int, ClusterView]
    nodes: list[NodeView]
    queued: list[JobView]
    running: list[RunningJobView] = field(default_factory=list)
    quotas: list[QuotaView] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: int
    node_ids: tuple[int, ...]


@dataclass(slots=True)
class Plan:
    placements: list[Placement] = field(default_factory=list)
    pending: dict[int, str] = field(default_factory=dict)
    scale_targets: dict[int, int] = field(default_factory=dict)
    release_nodes: list[int] = field(default_factory=list)
