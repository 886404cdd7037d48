"""Plain, immutable views the reconciler builds from the store for one scheduling pass.

All times are float seconds on one clock (epoch seconds: Snapshot.now, started_at,
idle_since) and durations are seconds (wall_clock, idle_seconds_before_scaledown), so the
scheduler can add them without knowing about datetimes or time zones.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class NodeView:
    id: int
    cluster_id: int
    name: str
    state: str  # preparing | idle | running | leaving | unusable | preempted
    job_id: int | None = None
    idle_since: float | None = None  # when it last became idle; scale-down counts from here

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
    # The size last asked of the backend. Nodes asked for but not listed yet count as
    # provisioning, so a pass does not ask twice for the same nodes.
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
    # for the reasons of the jobs waiting behind it: people know a job by its name and
    # experiment, not by the database's number
    name: str = ""
    experiment: str = ""


@dataclass(frozen=True, slots=True)
class RunningJobView:
    id: int
    cluster_id: int
    node_ids: tuple[int, ...]
    started_at: float
    wall_clock: float | None = None
    # The workspace whose quota the job holds; None means the cluster's workspace. Needed so
    # a quota reservation can tell when vCPUs come back.
    workspace_id: int | None = None
    name: str = ""  # for pending reasons: the jobs a waiting job waits for, by name


@dataclass(frozen=True, slots=True)
class QuotaView:
    workspace_id: int
    family: str
    vcpu_limit: int | None  # None: unlimited
    vcpu_used: int
    gpu_limit: int | None = None
    gpu_used: int = 0
    workspace: str = ""  # its name, for the reasons


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
    # True when an earlier or higher-priority job of the same cluster is still waiting: the
    # job jumped the queue under the backfill rule (it cannot delay that job's reservation).
    backfill: bool = False


@dataclass(frozen=True, slots=True)
class Reservation:
    """The promise made to a cluster's first waiting job, so that backfill cannot delay it.

    Exposed so the portal can show an expected start time and so tests can check the promise.
    """

    cluster_id: int
    job_id: int
    start: float  # estimated start (epoch seconds); math.inf when it cannot be estimated
    # Nodes expected to be spare at `start` beyond what the job needs, before backfill used
    # any of them: jobs still running at `start` may take at most this many nodes in total.
    # With an unknown start: the spare once every job that has a wall clock has ended.
    extra_nodes: int


@dataclass(slots=True)
class Plan:
    placements: list[Placement] = field(default_factory=list)
    pending: dict[int, str] = field(default_factory=dict)
    scale_targets: dict[int, int] = field(default_factory=dict)
    release_nodes: list[int] = field(default_factory=list)
    # cluster id -> the reservation of that cluster's first waiting job
    reservations: dict[int, Reservation] = field(default_factory=dict)
