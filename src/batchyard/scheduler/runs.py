"""The queue cut into runs, kept between passes by whoever keeps the queue.

Why: the fair walk (``scheduler.fairwalk``) takes the queue run by run, one run per
(priority, account, cluster), each in submit order. Cutting a 100k-job queue into runs
touched every job once more each pass (a tenth of the pass); the queue changes by a few
dozen jobs between passes, so the caller (the bench's simulation, a server's queue copy)
keeps the cut as jobs enter and leave, and hands it over in ``Snapshot.runs``. The walk uses
it only when it holds exactly the snapshot's queue (same count); else it cuts the queue
itself, so a stale copy costs time, never a wrong plan... as long as the count differs: the
caller must add and discard exactly what enters and leaves ``Snapshot.queued``.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable
from operator import attrgetter
from typing import Any

from batchyard.scheduler.model import JobView

_SEQ = attrgetter("seq")


class QueueRuns:
    """run key -> its jobs in submit order; the runs in the order they were made."""

    __slots__ = ("count", "runs")

    def __init__(self, jobs: Iterable[JobView] = ()) -> None:
        self.runs: dict[Any, list[JobView]] = {}
        self.count = 0
        for job in sorted(jobs, key=_SEQ):
            self.add(job)

    def __len__(self) -> int:
        return self.count

    def add(self, job: JobView) -> None:
        """A job entered the queue (usually the newest: an append)."""
        run = self.runs.get(job.run_key)
        if run is None:
            self.runs[job.run_key] = [job]
        elif run[-1].seq <= job.seq:
            run.append(job)
        else:
            insort(run, job, key=_SEQ)
        self.count += 1

    def discard(self, job: JobView) -> bool:
        """A job left the queue (placed, cancelled, held); whether it was here."""
        run = self.runs.get(job.run_key)
        if run is None:
            return False
        for i, other in enumerate(run):
            if other.id == job.id:
                del run[i]
                break
        else:
            return False
        if not run:
            del self.runs[job.run_key]
        self.count -= 1
        return True

    def lists(self) -> list[list[JobView]]:
        """The runs in the order of their first jobs (the walk's tie-break between runs of
        equal keys, as the cut of a queue in submit order gives it)."""
        return sorted(self.runs.values(), key=lambda run: run[0].seq)
