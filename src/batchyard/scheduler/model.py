"""Plain, immutable views the reconciler builds from the store for one scheduling pass.

All times are float seconds on one clock (epoch seconds: Snapshot.now, started_at,
idle_since) and durations are seconds (wall_clock, idle_seconds_before_scaledown), so the
scheduler can add them without knowing about datetimes or time zones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchyard.scheduler.runs import QueueRuns


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
    # whose fair share it draws on (FairShareView.accounts; 0: nobody's, as in a snapshot
    # without fair share)
    account: int = 0
    # (priority, account, cluster) as one dict key, made once with the view: the fair-share
    # walk groups a 100k-job queue by it every pass (scheduler.fairwalk)
    run_key: int | tuple[int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        account, cluster, priority = self.account, self.cluster_id, self.priority
        if 0 <= priority < 1 << 8 and 0 <= cluster < 1 << 32 and account >= 0:
            key: int | tuple[int, int, int] = (account << 32 | cluster) << 8 | priority
        else:
            key = (priority, account, cluster)
        object.__setattr__(self, "run_key", key)


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
    account: int = 0  # whose fair share it draws on


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
class AccountView:
    """One person's jobs in one team (Slurm's association): the leaf of the fair-share tree.

    ``usage``: what the account's attempts held, decayed with the half-life (GPU-seconds;
    CPU-seconds on nodes without GPUs), running ones up to now. The hours are the same
    usage split by kind, for the reasons people read."""

    id: int
    team: str  # "" for people in no team
    user: str
    shares: float = 1.0  # the user's shares inside the team
    usage: float = 0.0
    gpu_hours: float = 0.0
    cpu_hours: float = 0.0


@dataclass(frozen=True, slots=True)
class FairShareView:
    """The fair-share tree: teams (and the people in no team, as team "") under the root,
    their accounts under them. ``teams``: shares of every team, with jobs or not (as Slurm
    counts every sibling). ``charge``: seconds of its nodes a job is charged at once when it
    starts (and while it runs, until its own usage passes that), so that one pass with many
    free nodes does not hand them all to the team that was last to run."""

    accounts: dict[int, AccountView]
    teams: dict[str, float]
    charge: float = 3600.0


@dataclass(frozen=True, slots=True)
class Guarantee:
    """A team's guaranteed capacity on a cluster, in nodes (scheduler.guarantees)."""

    nodes: int
    borrow_limit: int | None = None  # nodes it may use beyond ``nodes``; None: no limit


@dataclass(frozen=True, slots=True)
class GuaranteeView:
    """``clusters``: cluster id -> team -> its guarantee there (only clusters with one);
    ``team_of``: a submitter's account (JobView.account) -> their team ("": none)."""

    clusters: dict[int, dict[str, Guarantee]]
    team_of: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    clusters: dict[int, ClusterView]
    nodes: list[NodeView]
    queued: list[JobView]
    running: list[RunningJobView] = field(default_factory=list)
    quotas: list[QuotaView] = field(default_factory=list)
    fairshare: FairShareView | None = None  # None: priority then FIFO
    # teams whose new jobs wait (a budget with the action hold): team -> the reason
    held_teams: dict[str, str] = field(default_factory=dict)
    guarantees: GuaranteeView | None = None  # None: no team is guaranteed anything
    # the queue already cut into the fair walk's runs, kept between passes by the caller
    # (scheduler.runs): it must hold exactly the jobs of ``queued`` (only its count is
    # checked); None: the walk cuts ``queued`` itself
    runs: QueueRuns | None = None


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
    # job id -> the team whose idle guarantee a placement borrows (scheduler.guarantees)
    borrowed: dict[int, str] = field(default_factory=dict)
