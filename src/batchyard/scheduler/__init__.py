"""The pure scheduler: a snapshot of queue, nodes and quotas in, a plan out. No I/O."""

from batchyard.scheduler.core import schedule
from batchyard.scheduler.model import (
    ClusterView,
    JobView,
    NodeView,
    Placement,
    Plan,
    QuotaView,
    RunningJobView,
    Snapshot,
)

__all__ = [
    "ClusterView",
    "JobView",
    "NodeView",
    "Placement",
    "Plan",
    "QuotaView",
    "RunningJobView",
    "Snapshot",
    "schedule",
]
