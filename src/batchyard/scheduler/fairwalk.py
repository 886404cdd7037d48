"""The queue walk with fair share and budget holds.

The queue is cut into runs, one per (priority, account, cluster), each in submit order. A
heap merges them: priority first, then the fair-share key (effective usage over shares,
``scheduler.fairshare``), then the run whose oldest job is oldest. A run is walked job after
job with the plain walk's steps (the same decisions, the same cached reasons, EASY backfill
around each cluster's head) until a placement raises its account's key (the admission
charge) past another run's, or it ends. With one account this is priority then FIFO. Runs
of equal keys are not interleaved job by job: people with no usage yet would otherwise swap
at every job of a long queue.

Two phases keep a 100k-job pass cheap. Touching jobs run by run touches them in no order
memory likes, so a run is walked only while its cluster can still place a job; once the
cluster is saturated (the plain walk's word: nothing more can start there this pass), the
rest of the run is left: its note is made in fair-share order, and its jobs get their
reasons at the end, run by run, each run's verdict worded once.

What the walk adds to reasons: a job of a team that comes after other teams' waiting jobs
on its cluster and in its priority class starts its reason with the fair share (``team
vision is over its fair share (used 41 GPU-h, share 25 %); 3 jobs of team nlp go first``),
counted over the runs walked before it; a held team's jobs get their budget's reason."""

from __future__ import annotations

import heapq
from collections import defaultdict
from itertools import repeat
from math import inf
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from batchyard.scheduler.fairmemo import SLOW, Verdicts, verdict
from batchyard.scheduler.fairshare import FairShare, Tally
from batchyard.scheduler.model import FairShareView, JobView, Snapshot
from batchyard.scheduler.nodes import NodePool
from batchyard.scheduler.runs import Run

if TYPE_CHECKING:
    from batchyard.scheduler.core import _Pass

_EMPTY = FairShareView({}, {})
_SEQ = attrgetter("seq")
_RUN_KEY = attrgetter("run_key")

# -priority, key, the run's oldest waiting job's seq, run, its team's version when made
Entry = tuple[int, float, int, int, int]


class _Run:
    __slots__ = ("account", "cluster", "jobs", "kept", "note", "pos", "priority", "team",
                 "texts")

    def __init__(self, jobs: list[JobView], team: str, kept: Run | None = None) -> None:
        first = jobs[0]
        self.jobs = jobs
        self.kept = kept  # kept between passes (scheduler.runs): the second phase's bulk path
        self.pos = 0
        self.account = first.account
        self.priority = first.priority
        self.cluster = first.cluster_id
        self.team = team
        self.note: str | None = None  # what its reasons start with, made when first walked
        # id(verdict) or a quota reason -> its reason behind a saturated cluster, once
        # needed: what a pass keeps alive to its end paces the collector's full collections
        self.texts: dict[int | str, str] | None = None


def _runs(queued: list[JobView]) -> dict[Any, list[JobView]]:
    """The queue cut into runs, each in submit order, in the order of their first jobs: one
    pass into a dict of lists when the queue comes in submit order, as the store gives it
    (a sorted copy first cost a 100k-job pass a fifth of its time in touching every job
    twice more); else a stable sort first, which gives the same."""
    groups: defaultdict[Any, list[JobView]] = defaultdict(list)
    last = -inf
    for job in queued:
        seq = job.seq
        if seq < last:
            return _sorted_runs(queued)
        last = seq
        groups[job.run_key].append(job)
    return groups


def _sorted_runs(queued: list[JobView]) -> dict[Any, list[JobView]]:
    groups: defaultdict[Any, list[JobView]] = defaultdict(list)
    ordered = sorted(queued, key=_SEQ)
    for job, key in zip(ordered, map(_RUN_KEY, ordered), strict=True):
        groups[key].append(job)
    return groups


def needed(snapshot: Snapshot) -> bool:
    """Whether the plain walk would order or word anything differently: more than one
    account, or a held team."""
    if snapshot.held_teams:
        return True
    return snapshot.fairshare is not None and len(snapshot.fairshare.accounts) > 1


class FairWalk:
    __slots__ = ("fast", "fs", "heap", "left", "many_teams", "p", "runs", "tallies", "verdicts")

    def __init__(self, p: _Pass, snapshot: Snapshot, fast: bool = True) -> None:
        self.p = p
        self.fast = fast  # False: every job takes the full steps (the property tests' yardstick)
        self.verdicts: dict[int, Verdicts] = {}
        self.fs = FairShare(snapshot.fairshare or _EMPTY, snapshot.clusters, snapshot.running,
                            snapshot.now)
        # (cluster, priority) -> waiting jobs walked, by team
        self.tallies: dict[tuple[int, int], Tally] = {}
        self.left: list[_Run] = []  # runs whose cluster saturated, in the order left
        fs = self.fs
        team_of = fs.team_of
        version = fs.version
        kept = snapshot.runs
        if kept is not None and len(kept) == len(snapshot.queued):
            runs = [_Run(r.jobs, team_of(r.jobs[0].account), r) for r in kept.ordered()]
        else:
            runs = [_Run(jobs, team_of(jobs[0].account))
                    for jobs in _runs(snapshot.queued).values()]
        self.runs = runs
        # self.entry(rid) of every run, the key made once per account (thousands of runs,
        # hundreds of people)
        keys: dict[int, float] = {}
        heap: list[Entry] = []
        self.heap = heap
        for rid, run in enumerate(runs):
            key = keys.get(run.account)
            if key is None:
                key = keys[run.account] = fs.key(run.account)
            heap.append((-run.priority, key, run.jobs[0].seq, rid, version.get(run.team, 0)))
        heapq.heapify(heap)
        self.many_teams = len({run.team for run in runs}) > 1

    def entry(self, rid: int) -> Entry:
        run = self.runs[rid]
        return (-run.priority, self.fs.key(run.account), run.jobs[run.pos].seq, rid,
                self.fs.version.get(run.team, 0))

    def walk(self, held: dict[str, str]) -> None:
        heap = self.heap
        runs = self.runs
        version = self.fs.version
        pending = self.p.plan.pending
        saturated = self.p.saturated
        pools = self.p.pools
        left = False
        while heap:
            entry = heapq.heappop(heap)
            rid = entry[3]
            run = runs[rid]
            if entry[4] != version.get(run.team, 0):  # its team placed a job since: re-key
                heapq.heappush(heap, self.entry(rid))
                continue
            if run.team in held:  # a budget with the action hold
                reason = held[run.team]
                for job in run.jobs[run.pos:]:
                    pending[job.id] = reason
                continue
            if run.cluster in saturated or run.cluster not in pools:
                self.leave(run)
                left = True
            else:
                left = self.segment(run, rid) or left
        if left:
            self.second_phase()

    def leave(self, run: _Run) -> None:
        """The rest of the run is worded by the second phase."""
        if run.note is None:
            run.note = self.note(run) if self.many_teams else ""
        self.left.append(run)
        if self.many_teams:
            self.count(run, len(run.jobs) - run.pos)

    def second_phase(self) -> None:
        """The jobs of the runs left, run by run in the order they were left (fair-share
        order), each run's verdict worded once."""
        pending = self.p.plan.pending
        saturated = self.p.saturated
        pools = self.p.pools
        for run in self.left:
            note = run.note or ""
            jobs = run.jobs
            cid = run.cluster
            sat = saturated.get(cid)
            largest, workspace = (sat[3], sat[4]) if sat is not None else (0, None)
            if self.bulk(run, sat, note):
                continue
            said: dict[int, str] = {}  # gang size -> its reason, while nothing is placed
            for i in range(run.pos, len(jobs)):
                job = jobs[i]
                nodes = job.nodes
                if 0 < nodes <= largest and (workspace is None or job.workspace_id == workspace):
                    text = said.get(nodes)
                    if text is None:
                        text = said[nodes] = self.worded(run, job, sat, note)
                    pending[job.id] = text
                    continue
                if self.full(run, job, note):
                    self.fs.placed(run.account, pools[cid].cluster, job.nodes)
                sat = saturated.get(cid)
                largest, workspace = (sat[3], sat[4]) if sat is not None else (0, None)
                said = {}

    def bulk(self, run: _Run, sat: Any, note: str) -> bool:
        """Word a kept run whose every job is behind its saturated cluster at once, by its
        ids and gang sizes (a reason depends on nothing else of a job of the run), without
        touching its jobs: in run order they lie scattered in memory."""
        kept = run.kept
        if kept is None or sat is None or run.pos >= len(run.jobs):
            return False
        small, large, space = kept.shape
        if small < 1 or large > sat[3] or (sat[4] is not None and space != sat[4]):
            return False
        pos = run.pos
        pending = self.p.plan.pending
        if sat[5] is None:  # behind the head: one reason for the whole run
            pending.update(zip(kept.ids[pos:], repeat(self.worded(run, run.jobs[pos], sat, note))))
            return True
        sizes = kept.sizes[pos:]
        said = {n: self.worded(run, run.jobs[pos + sizes.index(n)], sat, note)
                for n in set(sizes)}
        pending.update(zip(kept.ids[pos:], map(said.__getitem__, sizes), strict=True))
        return True

    def worded(self, run: _Run, job: JobView, sat: Any, note: str) -> str:
        """The reason of a job of a left run behind its saturated cluster."""
        group = sat[5]
        texts = run.texts
        if texts is None:
            texts = run.texts = {}
        if group is not None:
            nodes = job.nodes
            text = group.reason(sat[6], nodes * sat[7], nodes * sat[8], job, self.p.now)
            if note:
                said = texts.get(text)
                if said is None:
                    said = texts[text] = f"{note}; {text}"
                text = said
            return text
        cached = texts.get(id(sat))
        if cached is None:
            cached = texts[id(sat)] = self.behind(run, job, sat, note)
        return cached

    def behind(self, run: _Run, job: JobView, sat: Any, note: str) -> str:
        """The reason of a job behind a saturated cluster's head (no quota involved)."""
        head = self.p.pools[job.cluster_id].head
        if job.priority < sat[2]:
            text = sat[1]
        elif head is not None and head.account != job.account:
            text = self.p.pools[job.cluster_id].behind_fair
        else:
            text = sat[0]
        return f"{note}; {text}" if note else text

    def full(self, run: _Run, job: JobView, note: str) -> bool:
        """The plain walk's full steps for one job; whether it was placed."""
        p = self.p
        cid = job.cluster_id
        pool = p.pools.get(cid)
        if pool is None:
            p.plan.pending[job.id] = f"cluster {cid} does not exist"
            return False
        placements = p.plan.placements
        before = len(placements)
        head = pool.head
        if head is None:
            p.consider(job, pool)
        else:
            rel = 1 if job.priority < head.priority else 0 if job.account == \
                head.account else 2
            if pool.note != note:
                pool.set_note(note)
            if not p.refuse_cheaply(job, pool, head, rel):
                p.consider(job, pool, rel)
            sat = p.saturation(pool, head)
            if sat is not None:
                p.saturated[cid] = sat
        return len(placements) != before

    def note(self, run: _Run) -> str:
        """'team vision is over its fair share (...); 3 jobs of team nlp go first', or ''
        when no other team's job of its priority waits before this run's on its cluster."""
        tally = self.tallies.get((run.cluster, run.priority))
        ahead = tally.ahead(run.team) if tally is not None else ""
        return f"{self.fs.describe(run.team)}; {ahead}" if ahead else ""

    def count(self, run: _Run, waiting: int) -> None:
        """A walked segment's waiting jobs, for the reasons of the runs walked after it."""
        key = (run.cluster, run.priority)
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = Tally()
        tally.add(run.team, waiting)

    def segment(self, run: _Run, rid: int) -> bool:
        """Walk the run until a placement puts another run first (pushed back), its cluster
        is saturated (True: the rest is left to the second phase), or it ends. A job whose
        cheap refusal is remembered for the cluster's present state (``fairmemo``) gets it
        without the full steps."""
        p = self.p
        saturated = p.saturated
        cid = run.cluster
        if run.note is None:
            run.note = self.note(run) if self.many_teams else ""
        note = run.note
        placed = 0
        jobs = run.jobs
        start = run.pos
        n = len(jobs)
        walked = n - start
        pool = p.pools[cid]
        placements = p.plan.placements
        pending = p.plan.pending
        now = p.now
        verdicts = self.verdicts.get(cid)
        if verdicts is None:
            verdicts = self.verdicts[cid] = Verdicts(pool)
        if self.fast and pool.note != note:
            pool.set_note(note)
        i = start
        while i < n:
            if cid in saturated:
                walked = i - start
                run.pos = i
                if self.many_teams:
                    self.count(run, walked - placed)
                self.left.append(run)
                return True
            table = verdicts.current(len(placements), run.priority) if self.fast else None
            if table is not None:
                # the jobs whose verdict is known, in a tight loop: nothing changes meanwhile
                rel = self.rel(run, pool)
                pstart, gstart, closed = verdicts.pstart, verdicts.gstart, not pool.demand_open
                for i in range(i, n):  # noqa: B020 (resumes where the loop above stopped)
                    job = jobs[i]
                    wall = job.wall_clock
                    if wall is None:
                        where = 4
                    else:
                        end = now + wall
                        where = (end > pstart) + 2 * (end > gstart or end == inf)
                    key = (job.nodes, where, job.workspace_id)
                    said = table.get(key)
                    if said.__class__ is str:
                        pending[job.id] = said
                    elif closed and said is not None and said != SLOW:
                        pending[job.id] = pool.behind_reason(job.nodes, rel, said)  # type: ignore[arg-type]
                    else:
                        break
                else:
                    i = n
                    break
                if said is None:
                    said = verdict(p, pool, job)
                was = len(placements)
                went = self.full(run, job, note)
                i += 1
                if len(placements) == was and table is verdicts.current(was, run.priority):
                    table[key] = said
                    continue
            else:
                job = jobs[i]
                went = self.full(run, job, note)
                i += 1
            if not went:
                continue
            placed += 1
            self.fs.placed(run.account, pool.cluster, job.nodes)
            if i < n and self.heap:
                run.pos = i
                again = self.entry(rid)
                if again > self.heap[0]:
                    heapq.heappush(self.heap, again)
                    walked = i - start
                    break
        if i >= n:
            run.pos = n
        if self.many_teams:
            self.count(run, walked - placed)
        return False

    @staticmethod
    def rel(run: _Run, pool: NodePool) -> int:
        """How the cluster's head stands to the run's jobs (``NodePool.behind_reason``)."""
        head = pool.head
        assert head is not None
        return 1 if run.priority < head.priority else 0 if run.account == head.account else 2
