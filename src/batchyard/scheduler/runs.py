"""The queue cut into runs, kept between passes by whoever keeps the queue.

Why: the fair walk (``scheduler.fairwalk``) takes the queue run by run, one run per
(priority, account, cluster), each in submit order. Cutting a 100k-job queue into runs
touched every job once more each pass (a tenth of the pass); the queue changes by a few
dozen jobs between passes, so the caller (the bench's simulation, a server's queue copy)
keeps the cut as jobs enter and leave, and hands it over in ``Snapshot.runs``. Each run also
keeps its jobs' ids and gang sizes, and its workspace, so that the reasons of a run behind a
saturated cluster are written without touching its jobs one by one (in run order they lie
scattered in memory). The walk uses the cut only when it holds as many jobs as the
snapshot's queue; else it cuts the queue itself. The caller must add and discard exactly
what enters and leaves ``Snapshot.queued``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from itertools import filterfalse
from operator import attrgetter
from typing import Any

from batchyard.scheduler.model import JobView

_SEQ = attrgetter("seq")
MIXED = -1  # a run's jobs are in more than one workspace

# (smallest gang, largest gang, the workspace of all its jobs or MIXED)
Shape = tuple[int, int, int]


class Run:
    __slots__ = ("ids", "jobs", "shape", "sizes")

    def __init__(self, job: JobView) -> None:
        self.jobs = [job]
        self.ids = [job.id]
        self.sizes = [job.nodes]
        self.shape: Shape = (job.nodes, job.nodes, job.workspace_id)

    def reshape(self) -> None:
        spaces = {job.workspace_id for job in self.jobs}
        self.shape = (min(self.sizes), max(self.sizes),
                      spaces.pop() if len(spaces) == 1 else MIXED)


class QueueRuns:
    """run key -> its jobs in submit order."""

    __slots__ = ("count", "followed", "runs")

    def __init__(self, jobs: Iterable[JobView] = ()) -> None:
        self.runs: dict[Any, Run] = {}
        self.count = 0
        self.followed: dict[int, JobView] = {}  # id(view) -> view, for follow()
        for job in sorted(jobs, key=_SEQ):
            self.add(job)

    def __len__(self) -> int:
        return self.count

    def add(self, job: JobView) -> None:
        """A job entered the queue (usually the newest: an append)."""
        self.count += 1
        run = self.runs.get(job.run_key)
        if run is None:
            self.runs[job.run_key] = Run(job)
            return
        jobs = run.jobs
        if jobs[-1].seq <= job.seq:
            jobs.append(job)
            run.ids.append(job.id)
            run.sizes.append(job.nodes)
        else:
            at = bisect_right(jobs, job.seq, key=_SEQ)
            jobs.insert(at, job)
            run.ids.insert(at, job.id)
            run.sizes.insert(at, job.nodes)
        small, large, space = run.shape
        run.shape = (min(small, job.nodes), max(large, job.nodes),
                     space if space == job.workspace_id else MIXED)

    def discard(self, job: JobView) -> bool:
        """A job left the queue (placed, cancelled, held); whether it was here."""
        run = self.runs.get(job.run_key)
        if run is None:
            return False
        jobs, at = run.jobs, bisect_left(run.jobs, job.seq, key=_SEQ)  # one person's 100k
        while at < len(jobs) and jobs[at].seq == job.seq and jobs[at].id != job.id:
            at += 1
        if at == len(jobs) or jobs[at].id != job.id:
            return False
        del run.jobs[at], run.ids[at], run.sizes[at]
        self.count -= 1
        if not run.jobs:
            del self.runs[job.run_key]
        else:
            run.reshape()
        return True

    def follow(self, views: list[JobView]) -> None:
        """Make the cut hold exactly these views, for a caller that has the queue as a list
        each pass (the server: its queue copy after the holds): the views that entered or
        left since the last call are told apart by identity, in C, since a copy that keeps
        a job's view while its row is unchanged hands the same object again."""
        by_object = dict(zip(map(id, views), views, strict=True))
        before = self.followed
        # filterfalse over a dict's own __contains__: no set of 100k keys made twice a pass
        for gone in list(filterfalse(by_object.__contains__, before)):
            self.discard(before[gone])
        entered = [by_object[new] for new in filterfalse(before.__contains__, by_object)]
        for job in sorted(entered, key=_SEQ):
            self.add(job)
        self.followed = by_object

    def ordered(self) -> list[Run]:
        """The runs in the order of their first jobs (the walk's tie-break between runs of
        equal keys, as the cut of a queue in submit order gives it)."""
        return sorted(self.runs.values(), key=lambda run: run.jobs[0].seq)
