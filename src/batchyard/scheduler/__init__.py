"""The pure scheduler: a snapshot of queue, nodes and quotas in, a plan out. No I/O.

Rules (per cluster): priority then FIFO, all-or-nothing gangs, one job per node, EASY backfill
around the first waiting job's reservation, vCPU/GPU quotas per (workspace, family), autoscale
targets and idle scale-down, and a plain-words pending reason for every job left waiting.
Within a priority class, fair share between teams and people, and budget holds
(scheduler.fairwalk).
"""

from batchyard.scheduler.core import schedule
from batchyard.scheduler.model import (
    AccountView,
    ClusterView,
    FairShareView,
    JobView,
    NodeView,
    Placement,
    Plan,
    QuotaView,
    Reservation,
    RunningJobView,
    Snapshot,
)

__all__ = [
    "AccountView",
    "ClusterView",
    "FairShareView",
    "JobView",
    "NodeView",
    "Placement",
    "Plan",
    "QuotaView",
    "Reservation",
    "RunningJobView",
    "Snapshot",
    "schedule",
]
