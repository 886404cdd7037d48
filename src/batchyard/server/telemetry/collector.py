"""The cluster as the database holds it, read at each scrape: jobs by state, queued jobs by
pending-reason class, nodes by state, and (telemetry/utilisation.py) what nodes and running
jobs use. Label sets stay bounded: workspace, cluster, node, state and reason class; the only
series named after jobs are those of running jobs (a job's series ends with it). A few
grouped queries per scrape (bench/metrics_scrape.py: 1,000 nodes, 10,000 jobs)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import InfoMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from batchyard import __version__
from batchyard.server.telemetry.reasons import CLASSES, reason_class
from batchyard.server.telemetry.utilisation import gauge, utilisation
from batchyard.states import JOB_STATES, NODE_STATES
from batchyard.store.db import Database
from batchyard.store.models import Cluster, Job, Node, Workspace


class ClusterCollector(Collector):
    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Any]:
        with self.db.session() as session:
            yield from _collect(session, time.time())


def _collect(session: Session, stamp: float) -> Iterator[Any]:
    info = InfoMetricFamily("batchyard", "The batchyard server.")
    info.add_metric([], {"version": __version__})
    yield info
    workspaces = dict(session.execute(select(Workspace.id, Workspace.name)).all())
    clusters = {cid: (workspaces.get(wid, "?"), name.split("~deleted-")[0])
                for cid, wid, name in session.execute(
                    select(Cluster.id, Cluster.workspace_id, Cluster.name))}
    yield from _jobs(session, clusters)
    nodes = {nid: (*clusters.get(cid, ("?", "?")), str(name)) for nid, cid, name in
             session.execute(select(Node.id, Node.cluster_id, Node.name))}
    yield _node_states(session, clusters)
    yield from utilisation(session, stamp, nodes, workspaces)


def _jobs(session: Session, clusters: dict[int, tuple[str, str]]) -> Iterator[Any]:
    jobs = gauge("batchyard_jobs", "Jobs by state.", ("workspace", "cluster", "state"))
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for cid, state, count in session.execute(
            select(Job.cluster_id, Job.state, func.count()).group_by(Job.cluster_id, Job.state)):
        ws, cluster = clusters.get(cid, ("?", "?"))
        counts[(ws, cluster, str(state))] += int(count)
    for ws, cluster in set(clusters.values()):
        for state in JOB_STATES:
            counts.setdefault((ws, cluster, str(state)), 0)
    for key, count in sorted(counts.items()):
        jobs.add_metric(list(key), count)
    yield jobs
    queued = gauge("batchyard_queued_jobs", "Queued jobs by the class of their pending "
                    "reason.", ("workspace", "cluster", "reason"))
    by_class: dict[tuple[str, str, str], int] = defaultdict(int)
    for cid, reason, count in session.execute(
            select(Job.cluster_id, Job.pending_reason, func.count())
            .where(Job.state == "queued").group_by(Job.cluster_id, Job.pending_reason)):
        ws, cluster = clusters.get(cid, ("?", "?"))
        by_class[(ws, cluster, reason_class(reason))] += int(count)
    for ws, cluster in set(clusters.values()):
        for name in CLASSES:
            by_class.setdefault((ws, cluster, name), 0)
    for key, count in sorted(by_class.items()):
        queued.add_metric(list(key), count)
    yield queued


def _node_states(session: Session, clusters: dict[int, tuple[str, str]]) -> Any:
    family = gauge("batchyard_nodes", "Nodes by state.", ("workspace", "cluster", "state"))
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for cid, state, count in session.execute(
            select(Node.cluster_id, Node.state, func.count())
            .group_by(Node.cluster_id, Node.state)):
        ws, cluster = clusters.get(cid, ("?", "?"))
        counts[(ws, cluster, str(state))] += int(count)
    for ws, cluster in set(clusters.values()):
        for state in NODE_STATES:
            counts.setdefault((ws, cluster, str(state)), 0)
    for key, count in sorted(counts.items()):
        family.add_metric(list(key), count)
    return family
