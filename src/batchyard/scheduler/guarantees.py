"""Guaranteed capacity per team on a cluster, borrowing what other teams leave idle, and
reclaiming it (issue 35 §2, Kueue's cohorts in batchyard's words). Pure, like the rest of
the scheduler.

Capacity is counted in nodes (nodes of a cluster are interchangeable and one job holds
whole nodes); people set it in GPUs on a GPU cluster, so a guarantee is a whole number of
nodes (``cluster quota set --gpus 8`` on 4-GPU nodes: 2 nodes).

Rules. A team may always use its guarantee. A job that takes its team past its guarantee
borrows: it may start only on nodes that no other team's queued jobs need to reach their
own guarantees this pass, and only up to its team's borrow limit. When a team's queued job
would fit in its guarantee but the nodes are held by teams past theirs, ``reclaim`` picks
the borrowed jobs to preempt: those losing the least work (time running since the start, or
since the last checkpoint it reported), fewer jobs on a tie.

Only clusters with a guarantee pay for any of this: the scheduler's pass carries no guard
when no guarantee is set."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from batchyard.scheduler.model import ClusterView, GuaranteeView, JobView, RunningJobView


@dataclass(frozen=True, slots=True)
class Victim:
    job_id: int
    cluster_id: int
    team: str  # the borrower
    owner: str  # the team whose guaranteed capacity it gives back


def unit(cluster: ClusterView, nodes: int) -> str:
    """Nodes in the unit a cluster's guarantees are set in: GPUs, else nodes."""
    if cluster.gpus_per_node:
        count = nodes * cluster.gpus_per_node
        return f"{count} GPU" + ("" if count == 1 else "s")
    return f"{nodes} node" + ("" if nodes == 1 else "s")


def borrowed_text(owner: str) -> str:
    return f"runs on borrowed capacity (team {owner}'s guarantee)"


RECLAIMED = "preempted to give team "


def reclaimed_text(owner: str) -> str:
    return f"{RECLAIMED}{owner}'s guaranteed capacity back"


def given_back_text(team: str, jobs: list[str]) -> str:
    """The reason of a guaranteed team's job that waits for borrowed nodes to come back."""
    shown = ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
    verb = "is" if len(jobs) == 1 else "are"
    return (f"waiting for team {team}'s guaranteed capacity: {shown} on borrowed capacity "
            f"{verb} being preempted to give it back")


class Guard:
    """What the scheduler's pass asks before it places a job on a cluster with guarantees,
    and tells after: which placements borrow, and from whom. What guaranteed teams' queued
    jobs keep back is summed per cluster once and kept up to date on each placement: a
    borrower's question costs a few dict lookups."""

    __slots__ = ("borrowed", "clusters", "kept", "said", "team_of", "used", "want")

    def __init__(self, view: GuaranteeView, running: Iterable[RunningJobView],
                 queued: Iterable[JobView], held: Iterable[str] = ()) -> None:
        clusters = self.clusters = view.clusters
        team_of = self.team_of = view.team_of
        used: dict[tuple[int, str], int] = {}
        want: dict[tuple[int, str], int] = {}
        self.borrowed: dict[int, str] = {}  # job id -> the team whose guarantee it uses
        for run in running:
            if run.cluster_id in clusters:
                key = (run.cluster_id, team_of.get(run.account, ""))
                used[key] = used.get(key, 0) + len(run.node_ids)
        skip = set(held)
        for job in queued:
            own = clusters.get(job.cluster_id)
            if own is None:
                continue
            team = team_of.get(job.account, "")
            mine = own.get(team)
            if mine is not None and job.nodes <= mine.nodes and team not in skip:
                key = (job.cluster_id, team)
                want[key] = want.get(key, 0) + job.nodes
        self.used, self.want = used, want
        # cluster -> team -> its refusal worded, until what the cluster keeps back changes
        self.said: dict[int, dict[str, str]] = {}
        # cluster -> nodes its guaranteed teams' queued jobs still need (sum of needed())
        self.kept = {cid: sum(self.needed(cid, team) for team in own)
                     for cid, own in clusters.items()}

    def idle(self, cid: int, team: str) -> int:
        """Nodes of ``team``'s guarantee that none of its jobs holds."""
        mine = self.clusters[cid].get(team)
        return 0 if mine is None else max(0, mine.nodes - self.used.get((cid, team), 0))

    def needed(self, cid: int, team: str) -> int:
        """Of its idle guarantee, what its queued jobs still need this pass."""
        return min(self.idle(cid, team), self.want.get((cid, team), 0))

    def refuse(self, job: JobView, cluster: ClusterView, free: int) -> str | None:
        """None when ``job`` may start on ``free`` idle nodes; else why it waits."""
        cid = cluster.id
        own = self.clusters.get(cid)
        if own is None:
            return None
        team = self.team_of.get(job.account, "")
        mine = own.get(team)
        over = self.used.get((cid, team), 0) + job.nodes - (0 if mine is None else mine.nodes)
        if over <= 0:
            return None
        who = f"team {team}" if team else "people in no team"
        if mine is not None and mine.borrow_limit is not None and over > mine.borrow_limit:
            return (f"{who} would borrow {unit(cluster, over)} beyond its guarantee of "
                    f"{unit(cluster, mine.nodes)} on cluster {cluster.name}; its borrow "
                    f"limit is {unit(cluster, mine.borrow_limit)}")
        kept = self.kept[cid] - (self.needed(cid, team) if mine is not None else 0)
        if job.nodes <= free - kept:
            return None
        said = self.said.get(cid)
        if said is None:
            said = self.said[cid] = {}
        text = said.get(team)
        if text is None:
            owners = sorted(((self.needed(cid, o), o) for o in own if o != team), reverse=True)
            names = ", ".join(f"team {o}" for n, o in owners if n)
            text = said[team] = (
                f"the idle nodes of cluster {cluster.name} are guaranteed to {names}, whose "
                f"queued jobs need them; {who} may borrow only what guaranteed teams leave "
                "idle")
        return text

    def placed(self, job: JobView, cluster: ClusterView) -> None:
        cid = cluster.id
        own = self.clusters.get(cid)
        if own is None:
            return
        team = self.team_of.get(job.account, "")
        mine = own.get(team)
        key = (cid, team)
        before = self.needed(cid, team) if mine is not None else 0
        want = self.want.get(key, 0)
        if want:
            self.want[key] = max(0, want - job.nodes)
        used = self.used.get(key, 0)
        if used + job.nodes > (0 if mine is None else mine.nodes):
            lender = max(((self.idle(cid, o), o) for o in own if o != team), default=(0, ""))
            if lender[0] > 0:
                self.borrowed[job.id] = lender[1]
        self.used[key] = used + job.nodes
        if mine is not None:
            after = self.needed(cid, team)
            if after != before:
                self.kept[cid] += after - before
                self.said.pop(cid, None)


@dataclass(frozen=True, slots=True)
class Holder:
    """A running job as reclaim sees it."""

    job_id: int
    team: str
    nodes: int
    lost: float  # seconds of work lost if it stops now (since its start or last checkpoint)


def choose(candidates: list[Holder], need: int, spare: dict[str, int]) -> list[Holder] | None:
    """The jobs that free ``need`` nodes losing the least work (issue 36 §2: the least
    done since their last checkpoint), fewer jobs on a tie; only jobs of teams with nodes
    past their guarantee (``spare``: per team). None when even all of them would not free
    enough."""
    usable = [c for c in candidates if spare.get(c.team, 0) > 0]
    if sum(c.nodes for c in usable) < need:
        return None
    one = [c for c in usable if c.nodes >= need and spare.get(c.team, 0) > 0]
    single = [min(one, key=lambda c: (c.lost, c.nodes))] if one else None
    taken: list[Holder] = []
    got = 0
    left = dict(spare)
    for c in sorted(usable, key=lambda c: (c.lost, -c.nodes)):  # least work lost first
        if got >= need:
            break
        if left.get(c.team, 0) <= 0:
            continue
        taken.append(c)
        got += c.nodes
        left[c.team] -= c.nodes
    if got < need:
        return single
    for c in sorted(taken, key=lambda c: -c.lost):  # drop any the others cover without
        if got - c.nodes >= need:
            taken.remove(c)
            got -= c.nodes
    if single is not None and (single[0].lost, 1) <= (sum(c.lost for c in taken), len(taken)):
        return single
    return taken


def reclaim(view: GuaranteeView, running: list[RunningJobView], waiting: list[JobView],
            free: dict[int, int], stopping: set[int], now: float,
            checkpoints: dict[int, float] | None = None,
            awaits: dict[int, tuple[int, ...]] | None = None) -> list[Victim]:
    """The borrowed jobs to preempt so that guaranteed teams' waiting jobs can start.

    ``waiting``: queued jobs the pass did not place (in priority, then submit order);
    ``free``: idle nodes per cluster the pass left; ``stopping``: running jobs already
    being stopped (their nodes are on their way back); ``checkpoints``: from when a job's
    work is at risk, where known (its current attempt's start, or its last checkpoint).
    ``awaits``, when given, is filled: a waiting job that needs nodes being given back ->
    the jobs being stopped on its cluster (for its reason)."""
    checkpoints = checkpoints or {}
    team_of = view.team_of
    victims: list[Victim] = []
    by_cluster: dict[int, list[RunningJobView]] = defaultdict(list)
    for run in running:
        if run.cluster_id in view.clusters:
            by_cluster[run.cluster_id].append(run)
    queue: dict[int, list[JobView]] = defaultdict(list)
    for job in waiting:
        own = view.clusters.get(job.cluster_id)
        if own and team_of.get(job.account, "") in own:
            queue[job.cluster_id].append(job)
    for cid, jobs in queue.items():
        own = view.clusters[cid]
        idle = room = free.get(cid, 0)
        used: defaultdict[str, int] = defaultdict(int)
        holders: list[Holder] = []
        coming: list[int] = []  # jobs being stopped: their nodes are on their way back
        for run in by_cluster.get(cid, ()):
            if run.id in stopping:
                room += len(run.node_ids)
                coming.append(run.id)
                continue
            team = team_of.get(run.account, "")
            used[team] += len(run.node_ids)
            since = max(run.started_at, checkpoints.get(run.id, run.started_at))
            holders.append(Holder(run.id, team, len(run.node_ids), max(0.0, now - since)))
        jobs.sort(key=lambda j: (-j.priority, j.seq))
        for job in jobs:
            if not holders and room <= 0:
                break  # nothing left to give back on this cluster
            team = team_of.get(job.account, "")
            if used[team] + job.nodes > own[team].nodes:
                continue  # past its own guarantee: it borrows, it does not reclaim
            if job.nodes <= room:
                if awaits is not None and job.nodes > idle:
                    awaits[job.id] = tuple(coming)
                idle = max(0, idle - job.nodes)
                room -= job.nodes
                used[team] += job.nodes
                continue
            spare = {t: n - (own[t].nodes if t in own else 0) for t, n in used.items()
                     if t != team}
            chosen = choose(holders, job.nodes - room, spare)
            if chosen is None:
                continue
            for c in chosen:
                holders.remove(c)
                used[c.team] -= c.nodes
                room += c.nodes
                victims.append(Victim(c.job_id, cid, c.team, team))
                coming.append(c.job_id)
            if awaits is not None:
                awaits[job.id] = tuple(coming)
            idle = max(0, idle - job.nodes)
            room -= job.nodes
            used[team] += job.nodes
    return victims
