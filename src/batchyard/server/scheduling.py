"""One scheduling pass of the reconciler: the queue (kept from changes, ``queue_mirror``),
the nodes, running jobs and quotas into a snapshot; the pure scheduler's plan back into
attempts and pending reasons.

Two things keep a big queue cheap. The queue is not reloaded (see ``queue_mirror``), and the
pure scheduler (~40 ms at 100,000 queued jobs) runs only when one of its inputs changed, or
when enough time went by for the clock alone to change its answer (idle scale-down, wall
clock reservations), at most once per ``FORCE_FACTOR`` times its own last duration.

One bad object never stops the pass: a queued row the scheduler cannot read, or a placement
that fails to be written, fails that job alone with the reason (in a savepoint); the others
are placed as planned.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from batchyard.backends import get_backend
from batchyard.backends.base import has_queue
from batchyard.scheduler import (
    ClusterView,
    FairShareView,
    JobView,
    NodeView,
    Placement,
    Plan,
    RunningJobView,
    Snapshot,
    schedule,
)
from batchyard.scheduler.guarantees import borrowed_text
from batchyard.scheduler.runs import QueueRuns
from batchyard.server.fairshare_book import ACCOUNTS, UsageBook
from batchyard.server.guarantee_book import GuaranteeBook, take_back
from batchyard.server.nodes import broken, cluster_view
from batchyard.server.queue_mirror import Queued, QueueMirror, pending_updates
from batchyard.server.services import chargeback, common, holds
from batchyard.server.services.jobs import new_attempt
from batchyard.server.services.quotas import quota_views
from batchyard.states import ATTEMPT_ACTIVE
from batchyard.store.db import begin_write
from batchyard.store.models import Attempt, Cluster, Job, Node, now

log = logging.getLogger("batchyard.reconciler")

TICK = 0.25
FORCE_FACTOR = 100.0  # with nothing changed, run again after 100x the last run's time
BUSY_FACTOR = 10.0  # with changes (a stream of submits), at most one run per 10x its time
CHEAP = 0.005  # a scheduler run under 5 ms is always repeated: small queues see no change
CHUNK = 500  # jobs per UPDATE ... WHERE id IN (...)
_JOBS = Job.__table__
_SET_REASON = (update(_JOBS)  # type: ignore[arg-type]
               .where(_JOBS.c.id.in_(bindparam("ids", expanding=True)), _JOBS.c.state == "queued")
               .values(pending_reason=bindparam("reason")))


def set_state(session: Session, job: Job, state: str, message: str | None) -> None:
    if job.state != state:
        common.record(session, "job", job.id, job.state, state, message)
        job.state = state


def fail_unschedulable(session: Session, job: Job, why: str) -> None:
    """A queued job whose row the scheduler cannot use: it alone ends, naming why."""
    message = f"cannot be scheduled: {why}"
    log.warning("job %s %s", job.id, message)
    job.message = message
    job.pending_reason = None
    job.ended_at = now()
    set_state(session, job, "failed", message)


class SchedulingPass:
    def __init__(self) -> None:
        self.mirror = QueueMirror()
        self._inputs: tuple[Any, ...] | None = None
        self._ran_at = float("-inf")
        self._took = 0.0
        self._split_key: tuple[Any, ...] | None = None
        self._split_cache: list[Queued] = []
        self._handed_key: tuple[Any, ...] | None = None
        self._handed_ids: list[int] = []
        self._held_key: tuple[Any, ...] | None = None
        self._held_ids: list[int] = []
        self._kept: tuple[frozenset[int], list[Queued]] | None = None
        self.usage = UsageBook()
        self.guarantees = GuaranteeBook()
        # the fair walk's cut of the queue into runs, kept between passes (scheduler.runs)
        self._runs = QueueRuns()

    def _handed(self, own_queue: set[int]) -> list[int]:
        """Ids of queued jobs for backends with their own queue (Slurm), kept while the
        queue is unchanged."""
        if not own_queue:
            return []
        key = (self.mirror.version, tuple(sorted(own_queue)))
        if key != self._handed_key:
            self._handed_key = key
            self._handed_ids = [e.view.id for e in self.mirror.entries.values()
                                if e.view.cluster_id in own_queue]
        return self._handed_ids

    def _split(self, schedulable: set[int]) -> list[Queued]:
        """The entries the scheduler places, made again only when the queue or the clusters
        changed, and only for a pass that schedules: a walk over 100,000 entries on every
        pass was most of an idle pass, and of each pass under a stream of submits."""
        key = (self.mirror.version, tuple(sorted(schedulable)))
        if key != self._split_key:
            self._split_key = key
            self._split_cache = [e for e in self.mirror.entries.values()
                                 if e.view.cluster_id in schedulable]
        return self._split_cache

    def run(self, session: Session) -> tuple[Plan | None, list[int]]:
        self.mirror.refresh(session, self._bad_row)
        clusters = {c.id: c for c in session.scalars(select(Cluster).where(
            Cluster.deleting.is_(False)))}
        own_queue = {cid for cid, c in clusters.items()
                     if has_queue(get_backend(c.backend))}
        launched = self._hand_over(session, self._handed(own_queue))
        cluster_views = _readable(session, {cid: c for cid, c in clusters.items()
                                            if cid not in own_queue})
        clusters = {cid: clusters[cid] for cid in cluster_views}
        if len(self.mirror.entries) == len(self._handed(own_queue)) \
                and not any(c.spec.get("autoscale") for c in clusters.values()):
            self._inputs = None  # nothing for the scheduler, nothing to scale
            return None, launched
        nodes = [n for n in session.scalars(select(Node)) if n.cluster_id in clusters]
        running = [j for j in session.scalars(select(Job).where(Job.state.in_(
            ("preparing", "running", "finalizing")))) if j.cluster_id in clusters]
        nodes_of: dict[int, list[int]] = {}
        for n in nodes:
            if n.job_id is not None:
                nodes_of.setdefault(n.job_id, []).append(n.id)
        node_views = [NodeView(n.id, n.cluster_id, n.name, n.state, n.job_id, n.idle_since)
                      for n in nodes]
        running_views = [RunningJobView(j.id, j.cluster_id, tuple(nodes_of.get(j.id, ())),
                                        j.started_at or j.submitted_at,
                                        (j.spec.get("limits") or {}).get("max_wall_clock"),
                                        workspace_id=j.workspace_id, name=j.name,
                                        account=ACCOUNTS.id_of(j.created_by))
                         for j in running]
        quotas = quota_views(session, clusters.values(), nodes)
        book = self.guarantees
        book.refresh(session)
        inputs = (self.mirror.version, tuple(cluster_views.items()), tuple(node_views),
                  tuple(running_views), tuple(quotas), book.version)
        if not self._due(inputs):
            return None, launched
        started = time.perf_counter()
        queued = self._apply_holds(session, self._split(set(cluster_views)))
        views = [e.view for e in queued]
        at = now()
        held = chargeback.held_teams(session)
        guaranteed = book.view(set(cluster_views), views, running_views)
        fairshare = self._fairshare(session, at, views, bool(held))
        runs = None
        if fairshare is not None or held:
            # every entry scheduled (views are some of the entries'): the copy's own cut
            runs = self.mirror.runs if len(views) == len(self.mirror.runs) else self._runs
            if runs is self._runs:
                self._runs.follow(views)
        plan = schedule(Snapshot(now=at, clusters=cluster_views, nodes=node_views,
                                 queued=views, running=running_views, quotas=quotas,
                                 fairshare=fairshare, held_teams=held, guarantees=guaranteed,
                                 runs=runs))
        self._took = time.perf_counter() - started
        self._ran_at, self._inputs = time.monotonic(), inputs
        launched += self._place(session, plan, {n.id: n for n in nodes})
        if guaranteed is not None:  # borrowed jobs give guaranteed teams their nodes back
            plan.pending.update(take_back(session, guaranteed, plan, views, running_views,
                                          node_views, at, held))
        self._write_reasons(session, plan.pending)
        return plan, launched

    def _fairshare(self, session: Session, at: float, views: list[JobView], held: bool
                   ) -> FairShareView | None:
        """The fair-share tree, when more than one submitter has queued jobs (one alone
        is served in priority then FIFO order, as before) or a team is held (its budget)."""
        accounts = {v.account for v in views}
        if len(accounts) < 2 and not held:
            return None
        return self.usage.view(session, at, accounts)

    def _due(self, inputs: tuple[Any, ...]) -> bool:
        if self._took < CHEAP:
            return True
        since = time.monotonic() - self._ran_at
        if inputs != self._inputs:
            return since >= max(TICK, BUSY_FACTOR * self._took)
        return since >= max(TICK, FORCE_FACTOR * self._took)

    def _bad_row(self, session: Session, job: Job, exc: Exception) -> None:
        with session.begin_nested():
            fail_unschedulable(session, job, str(exc) or type(exc).__name__)

    def _apply_holds(self, session: Session, queued: list[Queued]) -> list[Queued]:
        """Dependencies and array throttles decide for the jobs that have them (their rows
        are read; the others cost nothing). The list without the held-back ones is made
        again only when that set changes."""
        if self._held_key != self._split_key:
            self._held_ids = [e.view.id for e in queued if e.held]
            self._held_key, self._kept = self._split_key, None
        if not self._held_ids:
            return queued
        rows = list(session.scalars(select(Job).where(Job.id.in_(self._held_ids))
                                    .order_by(Job.id)))
        go = {j.id for j in holds.apply(session, rows)}
        for job in rows:
            if job.state != "queued":
                self.mirror.discard(job.id)
            else:
                self.mirror.set_reason(job.id, job.pending_reason)
        blocked = frozenset(self._held_ids) - go
        if self._kept is None or self._kept[0] != blocked:
            self._kept = (blocked, [e for e in queued if e.view.id not in blocked])
        return self._kept[1]

    def _place(self, session: Session, plan: Plan, node_by_id: dict[int, Node]) -> list[int]:
        launched: list[int] = []
        placements = plan.placements
        fresh = _still_queued(session, placements)
        for placement in placements:
            if placement not in fresh:
                self.mirror.discard(placement.job_id)
                continue
            job = session.get(Job, placement.job_id)
            if job is None:
                continue
            try:
                with session.begin_nested():
                    launched.append(_place_one(session, job, placement, node_by_id,
                                               plan.borrowed.get(job.id)))
            except Exception as exc:  # this job alone: the others are placed as planned
                log.exception("placing job %s failed", placement.job_id)
                with session.begin_nested():
                    fail_unschedulable(session, job, f"placing it failed: {exc}")
            self.mirror.discard(placement.job_id)
        return launched

    def _write_reasons(self, session: Session, pending: dict[int, str]) -> None:
        """One UPDATE per reason (and per ``CHUNK`` jobs), not one per job: the jobs a stream
        of submits adds between two passes mostly get the same reason, and an executemany
        cost the pass ~20 us of the server's CPU a row."""
        updates = pending_updates(self.mirror.entries, pending)
        if not updates:
            return
        by_reason: dict[str, list[int]] = {}
        for row in updates:
            by_reason.setdefault(row["reason"], []).append(row["jid"])
        connection = session.connection()
        for reason, ids in by_reason.items():
            for start in range(0, len(ids), CHUNK):
                connection.execute(_SET_REASON, {"ids": ids[start:start + CHUNK],
                                                 "reason": reason})
        for row in updates:
            self.mirror.set_reason(row["jid"], row["reason"])

    def _hand_over(self, session: Session, job_ids: list[int]) -> list[int]:
        """A backend with its own queue (Slurm) gets a queued job at once: it waits there,
        with that queue's reason, and its nodes are bound when the backend starts it."""
        if not job_ids:
            return []
        handed = set(session.scalars(select(Attempt.job_id).where(
            Attempt.job_id.in_(job_ids), Attempt.state.in_(ATTEMPT_ACTIVE))))
        launched = []
        for job in session.scalars(select(Job).where(Job.id.in_(job_ids)).order_by(Job.id)):
            if job.id in handed or job.cancel_requested or job.state != "queued":
                continue
            attempt = new_attempt(session, job, [])
            job.pending_reason = "being handed to Slurm"
            self.mirror.set_reason(job.id, job.pending_reason)
            session.flush()
            launched.append(attempt.id)
        return launched


def _place_one(session: Session, job: Job, placement: Placement,
               node_by_id: dict[int, Node], lender: str | None = None) -> int:
    chosen = sorted((node_by_id[i] for i in placement.node_ids), key=lambda n: n.index)
    for node in chosen:
        node.job_id = job.id
        node.state = "running"
        node.idle_since = None
    attempt = new_attempt(session, job, chosen)
    job.borrowed_from = lender
    placed = f"placed on {', '.join(n.name for n in chosen)}"
    set_state(session, job, "preparing",
              placed if lender is None else f"{placed}; {borrowed_text(lender)}")
    job.pending_reason = None
    session.flush()
    return attempt.id


def _still_queued(session: Session, placements: list[Placement]) -> list[Placement]:
    """The placements whose job is still queued, read again under the write lock: a job
    terminated (or a sweep's trial stopped) since the queue was read must stay canceled, not
    be placed by a decision made on the old row."""
    if not placements:
        return []
    begin_write(session)
    fresh = dict(session.execute(select(Job.id, Job.state).where(
        Job.id.in_([p.job_id for p in placements]))).tuples().all())
    return [p for p in placements if fresh.get(p.job_id) == "queued"]


def _readable(session: Session, clusters: dict[int, Cluster]) -> dict[int, ClusterView]:
    """The clusters' views; one whose row cannot be read (a size an older version wrote) is
    left out of this pass and put in ``error`` naming why, and the rest are scheduled."""
    views: dict[int, ClusterView] = {}
    for cid, cluster in clusters.items():
        try:
            views[cid] = cluster_view(cluster)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            with session.begin_nested():
                broken(session, cluster, f"cannot be scheduled: {type(exc).__name__}: {exc}")
    return views
