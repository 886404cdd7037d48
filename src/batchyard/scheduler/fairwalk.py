"""The queue walk with fair share and budget holds.

The queue is cut into runs, one per (priority, account), each in submit order. A
heap merges them: priority first, then the fair-share key (effective usage over shares,
``scheduler.fairshare``), then the run whose oldest job is oldest. A run is walked job after
job with the plain walk's steps (the same decisions, the same cached reasons, EASY backfill
around each cluster's head) until a placement raises its account's key (the admission
charge) past another run's, or it ends. With one account this is priority then FIFO. Runs
of equal keys are not interleaved job by job: people with no usage yet would otherwise swap
at every job of a long queue.

What the walk adds to reasons: a job of a team that comes after other teams' waiting jobs
of its priority class starts its reason with the fair share (``team vision is over its fair
share (used 41 GPU-h, share 25 %); 3 jobs of team nlp go first``), counted over the runs
walked before it (per priority class, not per cluster: a note per run and cluster cost a
100k-job pass more than the walk itself); a held team's jobs get their budget's reason."""

from __future__ import annotations

import heapq
from itertools import pairwise
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from batchyard.scheduler.fairshare import FairShare, Tally
from batchyard.scheduler.model import FairShareView, JobView, Snapshot

if TYPE_CHECKING:
    from batchyard.scheduler.core import _Pass

_EMPTY = FairShareView({}, {})
_SEQ = attrgetter("seq")
# -priority, key, the run's oldest waiting job's seq, run, its team's version when made
Entry = tuple[int, float, int, int, int]


class _Run:
    __slots__ = ("account", "jobs", "note", "pos", "priority", "team", "texts")

    def __init__(self, jobs: list[JobView], team: str) -> None:
        first = jobs[0]
        self.jobs = jobs
        self.pos = 0
        self.account = first.account
        self.priority = first.priority
        self.team = team
        self.note: str | None = None  # what its reasons start with, made when first walked
        self.texts: dict[int, str] = {}  # id(verdict) -> reason behind a saturated cluster


def needed(snapshot: Snapshot) -> bool:
    """Whether the plain walk would order or word anything differently: more than one
    account, or a held team."""
    if snapshot.held_teams:
        return True
    return snapshot.fairshare is not None and len(snapshot.fairshare.accounts) > 1


class FairWalk:
    __slots__ = ("fs", "heap", "many_teams", "p", "runs", "tallies")

    def __init__(self, p: _Pass, snapshot: Snapshot) -> None:
        self.p = p
        self.fs = FairShare(snapshot.fairshare or _EMPTY, snapshot.clusters, snapshot.running,
                            snapshot.now)
        self.tallies: dict[int, Tally] = {}  # priority -> waiting jobs walked, by team
        groups: dict[Any, list[JobView]] = {}
        for job in snapshot.queued:
            found = groups.get(job.run_key)
            if found is None:
                groups[job.run_key] = [job]
            else:
                found.append(job)
        team_of = self.fs.team_of
        self.runs: list[_Run] = []
        for jobs in groups.values():
            if any(a.seq > b.seq for a, b in pairwise(jobs)):
                jobs.sort(key=_SEQ)  # a requeued job listed after newer ones
            self.runs.append(_Run(jobs, team_of(jobs[0].account)))
        self.heap = [self.entry(rid) for rid in range(len(self.runs))]
        heapq.heapify(self.heap)
        self.many_teams = len({run.team for run in self.runs}) > 1

    def entry(self, rid: int) -> Entry:
        run = self.runs[rid]
        return (-run.priority, self.fs.key(run.account), run.jobs[run.pos].seq, rid,
                self.fs.version.get(run.team, 0))

    def walk(self, held: dict[str, str]) -> None:
        heap = self.heap
        runs = self.runs
        version = self.fs.version
        pending = self.p.plan.pending
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
            self.segment(run, rid)

    def note(self, run: _Run) -> str:
        """'team vision is over its fair share (...); 3 jobs of team nlp go first', or ''
        when no other team's job of its priority waits before this run's."""
        tally = self.tallies.get(run.priority)
        ahead = tally.ahead(run.team) if tally is not None else ""
        return f"{self.fs.describe(run.team)}; {ahead}" if ahead else ""

    def count(self, run: _Run, waiting: int) -> None:
        """A walked segment's waiting jobs, for the reasons of the runs walked after it."""
        tally = self.tallies.get(run.priority)
        if tally is None:
            tally = self.tallies[run.priority] = Tally()
        tally.add(run.team, waiting)

    def segment(self, run: _Run, rid: int) -> None:
        """Walk the run until a placement puts another run first (pushed back), or it ends.
        The steps are the plain walk's (``_Pass.run``)."""
        p = self.p
        pending = p.plan.pending
        placements = p.plan.placements
        pools = p.pools
        saturated = p.saturated
        texts = run.texts
        if run.note is None:
            run.note = self.note(run) if self.many_teams else ""
        note = run.note
        placed = 0
        jobs = run.jobs
        now = p.now
        i = start = run.pos
        n = len(jobs)
        while i < n:
            job = jobs[i]
            i += 1
            cid = job.cluster_id
            sat = saturated.get(cid)
            if (
                sat is not None
                and 0 < job.nodes <= sat[3]
                and (sat[4] is None or job.workspace_id == sat[4])
            ):
                group = sat[5]
                if group is not None:
                    nodes = job.nodes
                    text = group.reason(sat[6], nodes * sat[7], nodes * sat[8], job, now)
                    pending[job.id] = f"{note}; {text}" if note else text
                    continue
                cached = texts.get(id(sat))
                if cached is None:
                    head = pools[cid].head
                    if job.priority < sat[2]:
                        text = sat[1]
                    elif head is not None and head.account != job.account:
                        text = pools[cid].behind_fair
                    else:
                        text = sat[0]
                    texts[id(sat)] = cached = f"{note}; {text}" if note else text
                pending[job.id] = cached
                continue
            pool = pools.get(cid)
            if pool is None:
                pending[job.id] = f"cluster {cid} does not exist"
                continue
            head = pool.head
            before = len(placements)
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
                    saturated[cid] = sat
            if len(placements) == before:
                continue
            placed += 1
            self.fs.placed(run.account, pool.cluster, job.nodes)
            if i < n and self.heap:
                run.pos = i
                again = self.entry(rid)
                if again > self.heap[0]:
                    heapq.heappush(self.heap, again)
                    break
        else:
            run.pos = n
        if self.many_teams:
            self.count(run, i - start - placed)
