"""vCPU and GPU quotas per (workspace, VM family), shared by every cluster of that family.

Quota is a second resource next to nodes, so it gets the same EASY treatment: the first job
that waits in a quota group holds a reservation on it, and later jobs of the group (from any
cluster) may take quota only if they end before that reservation or leave enough for it.
Without this, a stream of small jobs would keep a large one below its quota forever.
"""

from __future__ import annotations

import math

from batchyard.scheduler import reasons
from batchyard.scheduler.model import ClusterView, JobView, QuotaView, Snapshot

OK = 0
OVER = 1  # not enough quota left right now
HELD = 2  # enough left, but it is promised to an earlier job that this one would delay
NEVER = 3  # more than the whole limit


def outlives(end: float, start: float) -> bool:
    """Whether a job ending at `end` still runs at a reservation's `start`.

    A job with no wall clock outlives everything, even a reservation that is itself unknown:
    comparing inf > inf would wrongly let it through.
    """
    return end > start or end == math.inf


class QuotaGroup:
    """One (workspace, family) quota with this pass's placements charged to it."""

    __slots__ = (
        "ends",
        "extra_gpu",
        "extra_vcpu",
        "family",
        "gpu_limit",
        "gpu_used",
        "holder",
        "reason_cache",
        "start",
        "vcpu_limit",
        "vcpu_used",
        "workspace",
        "workspace_id",
    )

    def __init__(self, view: QuotaView) -> None:
        self.workspace_id = view.workspace_id
        self.workspace = reasons.workspace_label(view.workspace_id, view.workspace)
        self.family = view.family
        self.vcpu_limit = math.inf if view.vcpu_limit is None else view.vcpu_limit
        self.vcpu_used = view.vcpu_used
        self.gpu_limit = math.inf if view.gpu_limit is None else view.gpu_limit
        self.gpu_used = view.gpu_used
        # (end time, vCPUs, GPUs) given back by running jobs and by this pass's placements
        self.ends: list[tuple[float, int, int]] = []
        self.holder: JobView | None = None
        self.start = math.inf
        self.reason_cache: dict[tuple[int, int, int, bool], str] = {}
        self.extra_vcpu: float = 0
        self.extra_gpu: float = 0

    def check(self, vcpus: int, gpus: int, end: float) -> int:
        """OK, OVER, HELD or NEVER for a job costing (vcpus, gpus) that runs until `end`."""
        if vcpus > self.vcpu_limit or gpus > self.gpu_limit:
            return NEVER
        if self.vcpu_used + vcpus > self.vcpu_limit or self.gpu_used + gpus > self.gpu_limit:
            return OVER
        if (
            self.holder is not None
            and outlives(end, self.start)
            and (vcpus > self.extra_vcpu or gpus > self.extra_gpu)
        ):
            return HELD
        return OK

    def charge(self, vcpus: int, gpus: int, end: float) -> None:
        """Account a placement; if it outlives the reservation it eats the spare quota."""
        self.vcpu_used += vcpus
        self.gpu_used += gpus
        self.reason_cache.clear()
        if self.holder is None:
            self.ends.append((end, vcpus, gpus))
        elif outlives(end, self.start):
            self.extra_vcpu -= vcpus
            self.extra_gpu -= gpus

    def earliest(self, vcpus: int, gpus: int, now: float) -> float:
        """When enough quota comes back for (vcpus, gpus), from the expected ends of jobs."""
        free_v = self.vcpu_limit - self.vcpu_used
        free_g = self.gpu_limit - self.gpu_used
        if vcpus <= free_v and gpus <= free_g:
            return now
        self.ends.sort()
        for end, v, g in self.ends:
            free_v += v
            free_g += g
            if vcpus <= free_v and gpus <= free_g:
                return end
        return math.inf

    def hold(self, job: JobView, vcpus: int, gpus: int, start: float) -> None:
        """Promise (vcpus, gpus) to `job` at `start`; the spare is what later jobs may keep.

        With an unknown start the spare is what stays free once every job with a wall clock
        has ended: quota beyond that is never what the holder waits for.
        """
        self.holder = job
        self.start = start
        self.reason_cache.clear()
        free_v = self.vcpu_limit - self.vcpu_used
        free_g = self.gpu_limit - self.gpu_used
        for end, v, g in self.ends:
            if end <= start and end < math.inf:  # no wall clock: never comes back
                free_v += v
                free_g += g
        self.extra_vcpu = max(0, free_v - vcpus)
        self.extra_gpu = max(0, free_g - gpus)

    def reason(self, code: int, vcpus: int, gpus: int, job: JobView, now: float) -> str:
        """The plain-words quota reason for a check() result other than OK.

        Cached per (code, cost, priority relation) until the group changes: behind an
        exhausted quota, a long queue would otherwise format the same sentence per job.
        """
        lower = self.holder is not None and job.priority < self.holder.priority
        key = (code, vcpus, gpus, lower)
        text = self.reason_cache.get(key)
        if text is None:
            text = self.reason_cache[key] = self._reason(code, vcpus, gpus, job, now)
        return text

    def _reason(self, code: int, vcpus: int, gpus: int, job: JobView, now: float) -> str:
        ws, family = self.workspace, self.family
        if code == NEVER:
            if vcpus > self.vcpu_limit:
                return reasons.quota_never(family, "vCPUs", vcpus, int(self.vcpu_limit), ws)
            return reasons.quota_never(family, "GPUs", gpus, int(self.gpu_limit), ws)
        if code == HELD and self.holder is not None:
            why = reasons.relation(job.priority, self.holder.priority)
            when = reasons.when_clause(self.start, now)
            holder = self.holder
            return reasons.quota_held(family, ws, reasons.job_label(
                holder.id, holder.name, holder.experiment), why, when)
        if self.vcpu_used + vcpus > self.vcpu_limit:
            limit = int(self.vcpu_limit)
            need = int(vcpus - (limit - self.vcpu_used))
            return reasons.quota_over(family, "vCPUs", self.vcpu_used, limit, ws, need)
        limit = int(self.gpu_limit)
        need = int(gpus - (limit - self.gpu_used))
        return reasons.quota_over(family, "GPUs", self.gpu_used, limit, ws, need)


class QuotaLedger:
    """All quota groups of a pass; a group without a QuotaView is unlimited (None)."""

    __slots__ = ("groups",)

    def __init__(self, snapshot: Snapshot) -> None:
        self.groups: dict[tuple[int, str], QuotaGroup] = {
            (q.workspace_id, q.family): QuotaGroup(q) for q in snapshot.quotas
        }
        if not self.groups:
            return
        clusters = snapshot.clusters
        for run in snapshot.running:
            cluster = clusters.get(run.cluster_id)
            if cluster is None:
                continue
            ws = cluster.workspace_id if run.workspace_id is None else run.workspace_id
            group = self.groups.get((ws, cluster.family))
            if group is None:
                continue
            end = math.inf if run.wall_clock is None else run.started_at + run.wall_clock
            n = len(run.node_ids)
            group.ends.append(
                (max(snapshot.now, end), n * cluster.vcpus_per_node, n * cluster.gpus_per_node)
            )

    def group(self, job: JobView, cluster: ClusterView) -> QuotaGroup | None:
        """The quota a job of this cluster draws on: its own workspace, the cluster's family."""
        if not self.groups:
            return None
        return self.groups.get((job.workspace_id, cluster.family))
