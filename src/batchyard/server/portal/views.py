"""What the portal's pages and data endpoints show, gathered from the services (the portal
never reaches around them to the API's routers)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from batchyard.server.services import channel, clusters, common, jobs
from batchyard.states import JOB_STATES
from batchyard.store.models import Attempt, Cluster, Experiment, Job, Metric, Workspace

STATES = JOB_STATES
STALE_UTIL = 10.0  # a sample older than this (launcher gone) is not shown
RUNS_PAGE = 50  # runs per page of an experiment


def workspaces(session: Session) -> list[str]:
    common.workspace(session, common.DEFAULT)  # the default one always exists
    return list(session.scalars(select(Workspace.name).order_by(Workspace.name)))


def experiments(session: Session, ws: str) -> list[str]:
    w = common.workspace(session, ws)
    return list(session.scalars(select(Experiment.name).where(Experiment.workspace_id == w.id)
                                .order_by(Experiment.name)))


def experiment_list(session: Session, ws: str) -> list[dict[str, Any]]:
    """Every experiment of a workspace with its job counts by state and its latest submit."""
    w = common.workspace(session, ws)
    latest = dict(session.execute(
        select(Job.experiment_id, func.max(Job.submitted_at)).where(Job.workspace_id == w.id)
        .group_by(Job.experiment_id)).tuples().all())
    out = []
    for e in session.scalars(select(Experiment).where(Experiment.workspace_id == w.id)
                             .order_by(Experiment.name)):
        out.append(dict(common.experiment_dict(session, e), last_submitted=latest.get(e.id)))
    return out


def job_rows(session: Session, ws: str, experiment: str | None, state: str | None
             ) -> list[dict[str, Any]]:
    """The jobs page's rows, newest first; none yet for an experiment not created yet (its
    first job creates it, and the open page then shows that job)."""
    if experiment and experiment not in experiments(session, ws):
        return []
    rows = jobs.list_all(session, ws, experiment or None, state or None)
    rows.reverse()
    return rows


def _latest_attempt(session: Session, job_id: int) -> Attempt | None:
    return session.scalar(select(Attempt).where(Attempt.job_id == job_id)
                          .order_by(Attempt.number.desc()).limit(1))


def node_statuses(session: Session, attempt: Attempt) -> list[dict[str, Any]]:
    """What the launchers of one attempt last reported (utilisation samples included)."""
    return channel.reports(session, attempt)


def _fresh_util(status: dict[str, Any]) -> dict[str, Any] | None:
    util = status.get("util")
    if not isinstance(util, dict) or status.get("ended_at"):
        return None
    if time.time() - float(util.get("ts") or 0) > STALE_UTIL:
        return None
    return util


def queue_depths(session: Session, ws: str) -> dict[str, dict[str, int]]:
    """Per cluster of the workspace, its jobs queued and its jobs started and not ended (as
    sinfo beside squeue shows them): one grouped count."""
    w = common.workspace(session, ws)
    started = ("preparing", "running", "finalizing")
    rows = session.execute(
        select(Cluster.name, Job.state, func.count()).join(Cluster, Cluster.id == Job.cluster_id)
        .where(Job.workspace_id == w.id, Job.state.in_(("queued", *started)))
        .group_by(Cluster.name, Job.state)).tuples()
    out: dict[str, dict[str, int]] = {}
    for name, state, n in rows:
        depth = out.setdefault(name, {"queued": 0, "running": 0})
        depth["queued" if state == "queued" else "running"] += int(n)
    return out


def cluster_views(session: Session, ws: str) -> list[dict[str, Any]]:
    """Every cluster of a workspace with its nodes, the job on each and its utilisation, and
    its queue (jobs queued, jobs running)."""
    out = []
    depths = queue_depths(session, ws)
    for c in clusters.list_all(session, ws):
        data = clusters.show(session, ws, c["name"])
        data["queue"] = depths.get(c["name"], {"queued": 0, "running": 0})
        util_by_node: dict[str, dict[str, Any]] = {}
        job_names: dict[int, dict[str, Any]] = {}
        for node in data["nodes"]:
            job_id = node.get("job_id")
            if job_id is None:
                continue
            if job_id not in job_names:
                job = session.get(Job, job_id)
                exp = session.get(Experiment, job.experiment_id) if job else None
                job_names[job_id] = {"name": job.name if job else str(job_id),
                                     "experiment": exp.name if exp else ""}
                attempt = _latest_attempt(session, job_id)
                for status in node_statuses(session, attempt) if attempt else []:
                    util = _fresh_util(status)
                    if util is not None:
                        util_by_node[str(status.get("node"))] = util
            node["job"] = job_names[job_id]
        for node in data["nodes"]:
            node["util"] = util_by_node.get(node["name"])
        out.append(data)
    return out


def job_view(session: Session, ws: str, exp: str, name: str) -> dict[str, Any]:
    """``job show`` plus the per-node launcher status of the latest attempt."""
    data = jobs.show(session, ws, exp, name)
    job = jobs.find(session, ws, exp, name)
    attempt = _latest_attempt(session, job.id)
    nodes = []
    for status in node_statuses(session, attempt) if attempt else []:
        nodes.append({"node": status.get("node"), "node_rank": status.get("node_rank"),
                      "state": status.get("state"), "exit_code": status.get("exit_code"),
                      "message": status.get("message"),
                      "ranks": [{"rank": r.get("rank"), "exit_code": r.get("exit_code")}
                                for r in status.get("ranks") or []],
                      "util": _fresh_util(status)})
    data["node_status"] = nodes
    if job.state == "queued":
        from batchyard.server.services.estimates import of_job_safely

        data.update(of_job_safely(session, job.id, job.cluster_id))
    from batchyard.server.portal.tensorboard import link_for
    from batchyard.server.services.gpu_usage import job_series

    data["gpu_series"] = job_series(session, job)  # charted beside the job's own metrics
    data["tensorboard"] = link_for(attempt.directory if attempt else None, ws, exp, name)
    for a in data["attempts"]:
        a.pop("directory", None)  # a server path; the portal names files by attempt instead
    return data


def _job_ids(session: Session, ws: str, exp: str) -> dict[int, str]:
    w = common.workspace(session, ws)
    e = common.experiment(session, w, exp)
    return dict(session.execute(select(Job.id, Job.name).where(Job.experiment_id == e.id)
                                .order_by(Job.id)).tuples().all())


def experiment_view(session: Session, ws: str, exp: str, cursor: str | None = None,
                    limit: int = RUNS_PAGE) -> dict[str, Any]:
    """Runs side by side, newest first, a page at a time (``cursor``: the page after the
    one that handed it out): state, duration, tags and each scalar metric's last value. The
    metric names (for the compare view) are the whole experiment's."""
    experiment = common.experiment(session, common.workspace(session, ws), exp)
    info = common.experiment_dict(session, experiment)
    runs, following = jobs.list_page(session, ws, exp, limit=limit, cursor=cursor)
    newer = session.scalar(select(func.count()).select_from(Job).where(
        Job.experiment_id == experiment.id, Job.id >= jobs.decode_cursor(cursor))) if cursor else 0
    ids = _job_ids(session, ws, exp)
    names: list[str] = sorted(set(session.scalars(
        select(Metric.name).where(Metric.job_id.in_(list(ids)), Metric.value.is_not(None))
        .distinct())))
    shown = [r["id"] for r in runs]
    last: dict[tuple[int, str], float] = {}
    rows = session.execute(select(Metric.job_id, Metric.name, Metric.value)
                           .where(Metric.job_id.in_(shown), Metric.value.is_not(None))
                           .order_by(Metric.id)).tuples()
    for job_id, metric, value in rows:
        if value is not None:
            last[(job_id, metric)] = value
    stepped = sorted(set(session.scalars(
        select(Metric.name).where(Metric.job_id.in_(list(ids)), Metric.value.is_not(None))
        .group_by(Metric.job_id, Metric.name).having(func.count() > 1))))
    for run in runs:
        job = session.get(Job, run["id"])
        run["tags"] = dict((job.spec.get("tags") if job else None) or {})
        run["last"] = {m: last.get((run["id"], m)) for m in names}
    page = {"first": int(newer or 0) + 1, "last": int(newer or 0) + len(runs),
            "total": len(ids), "older": following, "newest": cursor is not None}
    return {"info": info, "runs": runs, "metrics": names, "stepped": stepped, "page": page}


def metric_series(session: Session, ws: str, exp: str, metric: str) -> dict[str, Any]:
    """One scalar metric of every run of an experiment, as (x, y) points per run; x is the
    step when logged, else the value's position."""
    ids = _job_ids(session, ws, exp)
    series: dict[str, list[list[float]]] = {name: [] for name in ids.values()}
    rows = session.execute(select(Metric.job_id, Metric.step, Metric.value)
                           .where(Metric.job_id.in_(list(ids)), Metric.name == metric,
                                  Metric.value.is_not(None))
                           .order_by(Metric.id)).tuples()
    for job_id, step, value in rows:
        if value is None:
            continue
        points = series[ids[job_id]]
        points.append([float(step if step is not None else len(points)), float(value)])
    return {"metric": metric, "series": series}

