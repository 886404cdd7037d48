"""The reconciler's copy of the queue, kept from changes instead of reloaded every pass.

Why: loading every queued row (and its JSON spec) four times a second was 76 % of the
server's time with 2,000 queued jobs, and a whole core at 100,000. A pass now reads only
what changed: rows past the highest id seen (submits) and the ids marked with ``changed``
(a requeue, a terminate, a sweep stopping a trial). Another server on the same PostgreSQL
database marks nothing here, and ids there can commit out of order, so every ``RESYNC``
seconds the queue's count and sum of ids (up to the highest id read) are compared with the
copy's, and the set of queued ids is compared in full when they differ (and every
``FULL_RESYNC`` seconds anyway). A stale entry in between is harmless, since a placement
re-reads its job's state under the write lock before it is made
(``reconciler._still_queued``). Reading 100,000 ids for the full comparison held the GIL for
~100-190 ms every 5-10 s under a stream of submits (the API's p99 with a big queue); the
count and sum take ~8 ms, in the database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.orm import Session

from batchyard.scheduler import JobView
from batchyard.scheduler.runs import QueueRuns
from batchyard.server import notify
from batchyard.server.fairshare_book import ACCOUNTS
from batchyard.server.services.holds import array_limit
from batchyard.store.models import Experiment, Job
from batchyard.store.specjson import spec_error

RESYNC = 5.0  # seconds between comparisons of the queue's count and sum of ids, at least
RESYNC_FACTOR = 100.0  # and at least 100x the last comparison's own time
FULL_RESYNC = 60.0  # seconds between full comparisons of the queued ids when those agree
RECENT = 5000  # ids below the highest read that a disagreement is first looked for in
_ALL_QUEUED_IDS = text("SELECT id FROM jobs WHERE state = 'queued'")
_RECENT_QUEUED_IDS = text("SELECT id FROM jobs WHERE state = 'queued' AND id > :low")
# up to the highest id the copy has seen: rows a stream of submits commits meanwhile are
# the next pass's (read by id), not a disagreement
_FINGERPRINT = select(func.count(), func.sum(Job.id)).where(Job.state == "queued",
                                                            Job.id <= bindparam("max_id"))
CHUNK = 500  # ids per IN (...) when loading rows

_dirty: set[int] = set()
_dirty_lock = threading.Lock()


def changed(session: Session, job_id: int) -> None:
    """Tell the reconciler to read this job's row again: it entered or left the queue, or a
    queued job's row changed, outside a submit. The reconciler may run in another server
    process on the same database: it hears once ``session`` commits."""
    mark_dirty(job_id)
    notify.relay_after_commit(session, f"dirty {job_id}")


def mark_dirty(job_id: int) -> None:
    with _dirty_lock:
        _dirty.add(job_id)


def _take_dirty() -> set[int]:
    global _dirty
    with _dirty_lock:
        taken, _dirty = _dirty, set()
    return taken


@dataclass(frozen=True, slots=True)
class Queued:
    """One queued job as the scheduler and the holds pre-pass need it."""

    view: JobView
    held: bool  # it has dependencies or an array throttle: the holds pre-pass decides
    reason: str | None  # the pending reason stored on its row


COLUMNS = (Job.id, Job.cluster_id, Job.workspace_id, Job.priority, Job.spec, Job.depends_on,
           Job.array_name, Job.pending_reason, Job.state, Job.name, Job.experiment_id,
           Job.created_by)


def view_of(job: Any, experiment: str = "") -> Queued:
    """Of a Job or a row of ``COLUMNS``; raises on one the scheduler cannot read (a caller
    fails that job alone). ``experiment``: its name, for the reasons of jobs behind it."""
    spec = job.spec
    error = spec_error(spec)
    if error is not None:
        raise ValueError(error)
    dist = spec.get("distribution") or {}
    wall = (spec.get("limits") or {}).get("max_wall_clock")
    view = JobView(job.id, job.cluster_id, job.workspace_id, int(spec.get("nodes", 1)),
                   int(dist.get("processes_per_node", 1)), int(job.priority), job.id,
                   float(wall) if wall is not None else None, name=job.name,
                   experiment=experiment, account=ACCOUNTS.id_of(job.created_by))
    if view.nodes < 1 or view.processes_per_node < 1:
        raise ValueError(f"nodes {view.nodes} x processes_per_node "
                         f"{view.processes_per_node} cannot be placed")
    return Queued(view, bool(job.depends_on) or _throttled(job), job.pending_reason)


def _throttled(job: Any) -> bool:
    return bool(job.array_name) and array_limit(job) is not None


BadRow = Callable[[Session, Job, Exception], None]
Row = Any  # a row of COLUMNS


class QueueMirror:
    def __init__(self) -> None:
        self.entries: dict[int, Queued] = {}
        self.max_id = 0
        self.version = 0  # bumped whenever the set of entries or one of them changes
        self._synced_at = float("-inf")
        self._sync_took = 0.0
        self._full_at = float("-inf")
        self._experiments: dict[int, str] = {}
        # the entries' views cut into the fair walk's runs, kept as entries come and go
        # (scheduler.runs): a pass that schedules every entry hands it over as it is
        self.runs = QueueRuns()

    def refresh(self, session: Session, bad_row: BadRow) -> None:
        """Bring the copy up to date. ``bad_row`` is called for a queued row that cannot be
        read as a job view (it is left out, and the rest of the queue goes on)."""
        dirty = _take_dirty()
        if time.monotonic() - self._synced_at >= max(RESYNC, RESYNC_FACTOR * self._sync_took) \
                and self._resync(session, bad_row):
            dirty -= set(self.entries)  # just compared
        while True:  # by the primary key, in order: PostgreSQL's generic plan of "id > $1
            # AND state = 'queued'" walked the state index (every queued row) each pass
            rows = list(session.execute(select(*COLUMNS).where(Job.id > self.max_id)
                                        .order_by(Job.id).limit(CHUNK)))
            if not rows:
                break
            self._take(session, [r for r in rows if r.state == "queued"], bad_row)
            self.max_id = max(self.max_id, rows[-1].id)
            if len(rows) < CHUNK:
                break
        if dirty:
            self._reread(session, dirty, bad_row)

    def discard(self, job_id: int) -> None:
        entry = self.entries.pop(job_id, None)
        if entry is not None:
            self.runs.discard(entry.view)
            self.version += 1

    def set_reason(self, job_id: int, reason: str | None) -> None:
        entry = self.entries.get(job_id)
        if entry is not None and entry.reason != reason:
            self.entries[job_id] = Queued(entry.view, entry.held, reason)

    # --- reading rows ----------------------------------------------------------------------

    def _resync(self, session: Session, bad_row: BadRow) -> bool:
        """Compare the copy with the queue; True when the ids were compared in full.

        Disagreement is mostly recent: concurrent submits commit out of id order on
        PostgreSQL, and a row below the highest id read lands after it. The queued ids of
        the last ``RECENT`` ids are compared first, and only if the count and sum still
        disagree after that is every queued id read."""
        started = time.perf_counter()
        self._synced_at = time.monotonic()
        full_due = self._synced_at - self._full_at >= FULL_RESYNC
        if not full_due and (self._agrees(session) or self._mend_recent(session, bad_row)):
            self._sync_took = time.perf_counter() - started
            return False
        self._compare(session, _ALL_QUEUED_IDS, {}, lambda _id: True, bad_row)
        self._full_at = self._synced_at
        self._sync_took = time.perf_counter() - started
        return True

    def _agrees(self, session: Session) -> bool:
        count, total = session.execute(_FINGERPRINT, {"max_id": self.max_id}).one()
        return (count, int(total or 0)) == (len(self.entries), sum(self.entries))

    def _mend_recent(self, session: Session, bad_row: BadRow) -> bool:
        low = self.max_id - RECENT
        self._compare(session, _RECENT_QUEUED_IDS, {"low": low}, lambda i: i > low, bad_row)
        return self._agrees(session)

    def _compare(self, session: Session, query: Any, params: dict[str, Any],
                 covers: Callable[[int], bool], bad_row: BadRow) -> None:
        queued = {row[0] for row in session.execute(query, params)}
        for gone in [i for i in self.entries if covers(i) and i not in queued]:
            self.discard(gone)
        missing = queued - set(self.entries)
        self._take(session, _rows(session, missing), bad_row)
        if queued:
            self.max_id = max(self.max_id, max(queued))

    def _reread(self, session: Session, ids: set[int], bad_row: BadRow) -> None:
        rows = _rows(session, ids)
        found = {j.id for j in rows}
        for job in rows:
            if job.state != "queued":
                self.discard(job.id)
        for gone in ids - found:
            self.discard(gone)
        self._take(session, [j for j in rows if j.state == "queued"], bad_row)

    def _experiment(self, session: Session, experiment_id: int) -> str:
        name = self._experiments.get(experiment_id)
        if name is None:  # a new experiment: read them all again (few, and never renamed)
            self._experiments = {row[0]: row[1] for row in session.execute(
                select(Experiment.id, Experiment.name))}
            name = self._experiments.setdefault(experiment_id, "")
        return name

    def _take(self, session: Session, rows: Iterable[Row], bad_row: BadRow) -> None:
        for job in rows:
            self.max_id = max(self.max_id, job.id)
            try:
                entry = view_of(job, self._experiment(session, job.experiment_id))
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                self.discard(job.id)
                row = session.get(Job, job.id)
                if row is not None:
                    bad_row(session, row, exc)
                continue
            old = self.entries.get(job.id)
            if old != entry:
                if old is not None:
                    self.runs.discard(old.view)
                self.entries[job.id] = entry
                self.runs.add(entry.view)
                self.version += 1


def _rows(session: Session, ids: Iterable[int]) -> list[Row]:
    """Only the columns a view needs: whole ORM rows of 100,000 jobs took seconds."""
    ordered = sorted(ids)
    rows: list[Row] = []
    for start in range(0, len(ordered), CHUNK):
        rows.extend(session.execute(select(*COLUMNS).where(
            Job.id.in_(ordered[start:start + CHUNK]))))
    return rows


def pending_updates(entries: dict[int, Queued], pending: dict[int, str]) -> list[dict[str, Any]]:
    """The rows whose pending reason the last plan changed (``{"jid", "reason"}``)."""
    return [{"jid": job_id, "reason": reason} for job_id, reason in pending.items()
            if job_id in entries and entries[job_id].reason != reason]
