"""Start-time estimates of queued jobs, and what-if answers, read from the store.

The store is read as the reconciler reads it for a pass (clusters, nodes, running jobs,
the queued rows' few columns), then the pure walk (scheduler.estimate) answers. Answers
for ``job show`` are kept for ``KEEP`` seconds per cluster while that cluster's queue and
running jobs stay the same: a client polling a queued job must not make the server walk a
10,000-job queue four times a second."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from sqlalchemy import JSON, func, select, type_coerce
from sqlalchemy.orm import Session

from batchyard.backends import get_backend
from batchyard.backends.base import has_queue
from batchyard.scheduler import ClusterView, JobView, NodeView, RunningJobView, Snapshot
from batchyard.scheduler.estimate import Estimate, Option, estimates
from batchyard.scheduler.estimate import what_if as walk_what_if
from batchyard.server.fairshare_book import ACCOUNTS, UsageBook
from batchyard.server.nodes import cluster_view
from batchyard.server.services import chargeback
from batchyard.store.models import Cluster, Job, Node, now

log = logging.getLogger("batchyard.estimates")
KEEP = 5.0
ACTIVE = ("preparing", "running", "finalizing")
_kept: dict[int, tuple[float, tuple[Any, ...], dict[int, Estimate]]] = {}
_lock = threading.Lock()
_BOOK = UsageBook()


def snapshot(session: Session, clusters: list[Cluster], *, fair: bool = True) -> Snapshot:
    """What a scheduling pass would see of these clusters (those with their own queue,
    Slurm, are left out: their queue decides)."""
    views: dict[int, ClusterView] = {}
    for c in clusters:
        if has_queue(get_backend(c.backend)):
            continue
        try:
            views[c.id] = cluster_view(c)
        except (TypeError, ValueError, KeyError, AttributeError):
            continue
    ids = list(views)
    nodes = list(session.scalars(select(Node).where(Node.cluster_id.in_(ids)))) if ids else []
    node_views = [NodeView(n.id, n.cluster_id, n.name, n.state, n.job_id, n.idle_since)
                  for n in nodes]
    nodes_of: dict[int, list[int]] = {}
    for n in nodes:
        if n.job_id is not None:
            nodes_of.setdefault(n.job_id, []).append(n.id)
    running = [RunningJobView(j.id, j.cluster_id, tuple(nodes_of.get(j.id, ())),
                              j.started_at or j.submitted_at,
                              (j.spec.get("limits") or {}).get("max_wall_clock"),
                              workspace_id=j.workspace_id, name=j.name,
                              account=ACCOUNTS.id_of(j.created_by))
               for j in session.scalars(select(Job).where(Job.state.in_(ACTIVE),
                                                          Job.cluster_id.in_(ids)))] \
        if ids else []
    queued = _queued(session, ids) if ids else []
    at = now()
    held = chargeback.held_teams(session) if fair else {}
    accounts = {v.account for v in queued}
    fairshare = None
    if fair and (len(accounts) > 1 or held):
        with _lock:  # one book, read on from where it was: history is read once
            fairshare = _BOOK.view(session, at, accounts)
    return Snapshot(now=at, clusters=views, nodes=node_views, queued=queued, running=running,
                    fairshare=fairshare, held_teams=held)


def _queued(session: Session, cluster_ids: list[int]) -> list[JobView]:
    """The queued jobs of these clusters, as the scheduler's views: only the three fields of
    the spec the walk needs, read by the database (decoding 10,000 whole specs took ~0.5 s
    of a what-if). Jobs with dependencies book nothing: they wait for them first."""
    spec = type_coerce(Job.spec, JSON)
    query = select(Job.id, Job.cluster_id, Job.workspace_id, Job.priority, Job.name,
                   Job.created_by, Job.depends_on, spec["nodes"].as_float(),
                   spec[("distribution", "processes_per_node")].as_float(),
                   spec[("limits", "max_wall_clock")].as_float()).where(
        Job.state == "queued", Job.cluster_id.in_(cluster_ids))
    if session.get_bind().dialect.name == "sqlite":  # a row that is not JSON: not booked
        query = query.where(func.json_valid(Job.spec))
    views = []
    rows = session.connection().execute(query)  # past the ORM: its row handling cost 40 %
    for jid, cid, wid, priority, name, who, depends, nodes, ppn, wall in rows:
        if depends:
            continue
        views.append(JobView(jid, cid, wid, int(nodes or 1), int(ppn or 1), int(priority), jid,
                             wall, name=name, account=ACCOUNTS.id_of(who)))
    return views


def _fingerprint(session: Session, cluster_id: int) -> tuple[Any, ...]:
    return tuple(session.execute(select(Job.state, func.count(), func.sum(Job.id))
                                 .where(Job.cluster_id == cluster_id,
                                        Job.state.in_(("queued", *ACTIVE)))
                                 .group_by(Job.state).order_by(Job.state)).tuples().all())


def of_job(session: Session, job_id: int, cluster_id: int) -> dict[str, Any]:
    """``estimated_start`` (epoch seconds, or None: unknown) and ``estimate`` (the details)
    of one queued job."""
    key = _fingerprint(session, cluster_id)
    with _lock:
        kept = _kept.get(cluster_id)
    if kept is not None and kept[1] == key and time.monotonic() - kept[0] < KEEP:
        answers = kept[2]
    else:
        c = session.get(Cluster, cluster_id)
        if c is None:
            return {}
        snap = snapshot(session, [c])
        if cluster_id not in snap.clusters:
            return {"estimated_start": None,
                    "estimate": {"start": None, "ahead": None,
                                 "note": "unknown: the cluster's own queue (Slurm) decides"}}
        answers = estimates(snap)
        with _lock:
            _kept[cluster_id] = (time.monotonic(), key, answers)
    found = answers.get(job_id)
    if found is None:
        return {"estimated_start": None,
                "estimate": {"start": None, "ahead": None,
                             "note": "unknown: it waits for its dependencies, an array "
                             "throttle or a budget"}}
    start = None if math.isinf(found.start) else found.start
    return {"estimated_start": start,
            "estimate": {"start": start, "ahead": found.ahead, "note": found.note}}


def of_job_safely(session: Session, job_id: int, cluster_id: int) -> dict[str, Any]:
    """``of_job``, except that a row it cannot read costs the estimate, never `job show`."""
    try:
        with session.begin_nested():
            return of_job(session, job_id, cluster_id)
    except Exception:
        log.exception("estimating job %s failed", job_id)
        return {"estimated_start": None,
                "estimate": {"start": None, "ahead": None,
                             "note": "unknown: it could not be estimated (see the server log)"}}


def what_if(session: Session, cluster: Cluster, candidates: list[Cluster], job: JobView
            ) -> dict[str, Any]:
    """The answer of a what-if submit: its start where it was asked, and the options
    (fewer nodes there; its nodes on ``candidates``, other clusters that can run it) that
    would start it sooner."""
    clusters = [cluster, *candidates]
    snap = snapshot(session, clusters)
    names = {c.id: c.name for c in clusters}
    if cluster.id not in snap.clusters:
        return {"what_if": True, "cluster": cluster.name, "nodes": job.nodes,
                "estimated_start": None, "ahead": None,
                "note": "unknown: the cluster's own queue (Slurm) decides", "sooner": []}
    options = walk_what_if(snap, job, [c.id for c in candidates])
    asked = options[0]
    sooner = [_option(o, names, snap.now) for o in options[1:] if o.start < asked.start]
    sooner.sort(key=lambda o: (o["estimated_start"] is None, o["estimated_start"] or 0.0))
    return {"what_if": True, "cluster": cluster.name, "nodes": job.nodes, "now": snap.now,
            **_option(asked, names, snap.now), "sooner": sooner}


def _option(option: Option, names: dict[int, str], at: float) -> dict[str, Any]:
    start = None if math.isinf(option.start) else option.start
    return {"cluster": names[option.cluster_id], "nodes": option.nodes,
            "estimated_start": start,
            "wait_seconds": None if start is None else max(0.0, start - at),
            "ahead": option.ahead, "note": option.note}
