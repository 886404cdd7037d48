"""Jobs: submit (validate, check it can ever run, queue), show, list, terminate, delete.
Starting and following attempts is the reconciler's work."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.backends import get_backend
from batchyard.backends.base import Gang
from batchyard.config import data_root
from batchyard.errors import Conflict, SpecError, Unschedulable
from batchyard.server.context import ServerContext, kick_after_commit
from batchyard.server.services import channel, common, storage
from batchyard.server.services.clusters import node_info
from batchyard.snapshot import digest, pack
from batchyard.spec.job import PRIORITY_ORDER, JobSpec
from batchyard.states import JOB_ACTIVE, JOB_TERMINAL
from batchyard.storage.secrets import seal_spec, unseal_spec
from batchyard.store.models import Attempt, Cluster, Event, Experiment, Job, Node, Workspace, now

ACTIVE = JOB_ACTIVE
TERMINAL = JOB_TERMINAL


def job_dir(ws: str, exp: str, job: str) -> Path:
    return data_root() / "workspaces" / ws / "experiments" / exp / "jobs" / job


def _cluster_for(session: Session, ws: Workspace, spec: JobSpec, name: str | None) -> Cluster:
    wanted = name or spec.cluster
    if wanted:
        return common.cluster(session, ws, wanted)
    clusters = list(session.scalars(select(Cluster).where(Cluster.workspace_id == ws.id,
                                                          Cluster.deleting.is_(False))))
    if len(clusters) == 1:
        return clusters[0]
    raise SpecError("cluster: name the cluster to run on (-c/--cluster or `cluster:` in the "
                    f"job file); workspace {ws.name!r} has {len(clusters)} clusters")


def check_fits(spec: JobSpec, c: Cluster) -> None:
    """Reject at submit what can never run here, rather than queueing it forever."""
    max_nodes = c.spec.get("autoscale", {}).get("max_nodes") if c.spec.get("autoscale") else \
        (c.spec.get("manual") or {}).get("target_node_count", c.target_nodes)
    max_nodes = max(int(max_nodes or 0), c.target_nodes)
    from batchyard.server.discovery import is_discovered

    elastic = not c.spec.get("autoscale") and is_discovered(c)  # Ray: nodes join any time
    if spec.nodes > max_nodes and not elastic:
        raise Unschedulable(
            f"nodes: the job needs {spec.nodes} nodes but cluster {c.name!r} has at most "
            f"{max_nodes}; resize the cluster or ask for fewer nodes"
        )
    slots = int(c.size.get("vcpus") or 1)
    ppn = spec.distribution.processes_per_node
    if ppn > max(slots, int(c.size.get("gpus") or 0)):
        raise Unschedulable(
            f"distribution.processes_per_node: {ppn} processes per node exceed the {slots} "
            f"slots (vCPUs) of a {c.size.get('name')} node"
        )
    if spec.distribution.process_count and spec.distribution.process_count > spec.nodes * slots:
        raise Unschedulable(
            f"distribution.process_count: {spec.distribution.process_count} processes exceed "
            f"{spec.nodes} nodes x {slots} slots"
        )


def _code(ctx: ServerContext, spec: JobSpec) -> str | None:
    if not spec.code:
        return None
    if spec.code.startswith("snapshot:"):
        sha = spec.code.split(":", 1)[1]
        if not (ctx.snapshots / f"{sha}.tar.gz").is_file():
            raise SpecError(f"code: snapshot {sha[:12]} was never uploaded")
        return sha
    path = Path(spec.code)
    if not path.is_absolute() or not path.is_dir():
        raise SpecError(f"code: {spec.code!r} is not a directory on the server; upload it as a "
                        "snapshot (the CLI and SDK do this for you)")
    data = pack(path)
    sha = digest(data)
    target = ctx.snapshots / f"{sha}.tar.gz"
    if not target.exists():
        target.write_bytes(data)
    return sha


def submit(ctx: ServerContext, session: Session, workspace: str, spec: JobSpec, *,
           experiment: str | None = None, cluster: str | None = None, name: str | None = None,
           source_format: str = "native", dry_run: bool = False) -> dict[str, Any]:
    ws = common.workspace(session, workspace)
    exp_name = experiment or spec.experiment or common.DEFAULT
    c = _cluster_for(session, ws, spec, cluster)
    check_fits(spec, c)
    job_name = common.check_name("job", name or spec.name or f"job-{uuid.uuid4().hex[:8]}")
    sha = _code(ctx, spec)
    stored = spec.model_dump(mode="json", exclude_none=True)
    stored["cluster"] = c.name
    stored["experiment"] = exp_name
    stored["name"] = job_name
    if sha:
        stored["code"] = f"snapshot:{sha}"
    storage.check(session, ws.id, stored)
    stored, sealed = seal_spec(stored)
    if dry_run:
        return dry_run_text(ctx, session, ws, exp_name, job_name, stored, c)
    exp = common.experiment(session, ws, exp_name, create=True)
    if session.scalar(select(Job.id).where(Job.experiment_id == exp.id, Job.name == job_name)):
        raise Conflict(f"job {job_name!r} already exists in experiment {exp_name!r}")
    directory = job_dir(ws.name, exp.name, job_name)
    job = Job(workspace_id=ws.id, experiment_id=exp.id, cluster_id=c.id, name=job_name,
              spec=stored, source_format=source_format, state="queued",
              pending_reason="waiting for the scheduler", priority=PRIORITY_ORDER[spec.priority],
              directory=str(directory), submitted_at=now(), sealed=sealed or None)
    session.add(job)
    session.flush()
    common.record(session, "job", job.id, None, "queued", f"submitted to cluster {c.name}")
    kick_after_commit(session)
    return job_dict(session, job)


def dry_run_text(ctx: ServerContext, session: Session, ws: Workspace, exp: str, job_name: str,
                 stored: dict[str, Any], c: Cluster) -> dict[str, Any]:
    nodes = list(session.scalars(select(Node).where(Node.cluster_id == c.id)
                                 .order_by(Node.index)))[: stored.get("nodes", 1)]
    if len(nodes) < stored.get("nodes", 1):
        raise Unschedulable(f"nodes: cluster {c.name!r} has {len(nodes)} nodes now; a dry run "
                            "shows real nodes")
    attempt_uuid = "00000000-dry-run"
    directory = job_dir(ws.name, exp, job_name)
    gang = Gang(job_id=0, job_name=job_name, workspace=ws.name, experiment=exp, attempt=1,
                attempt_uuid=attempt_uuid, attempt_dir=str(directory / attempt_uuid),
                checkpoint_dir=str(directory / "checkpoints"), spec=stored,
                nodes=[node_info(n) for n in nodes], api_url=ctx.api_url, api_token="***",
                code_archive=None)
    text = get_backend(c.backend).dry_run(gang)
    return {"dry_run": True, "name": job_name, "cluster": c.name, "experiment": exp,
            "spec": JobSpec.model_validate(stored).redacted(), "plan": text}


def launch_spec(session: Session, job: Job, experiment: str) -> dict[str, Any]:
    """The spec the backend gets: secrets unsealed, storage resolved to stores with
    credentials (it goes into the node plans, mode 0600, and nowhere else)."""
    full = unseal_spec(job.spec, job.sealed)
    return storage.resolve(session, job.workspace_id, full, job_path=f"{experiment}/{job.name}")


def new_attempt(session: Session, job: Job, nodes: list[Node]) -> Attempt:
    number = job.attempt + 1
    attempt_uuid = str(uuid.uuid4())
    attempt = Attempt(job_id=job.id, number=number, uuid=attempt_uuid, state="launching",
                      node_ids=[n.id for n in nodes],
                      directory=str(Path(job.directory) / attempt_uuid), created_at=now())
    session.add(attempt)
    job.attempt = number
    return attempt


def job_dict(session: Session, job: Job, *, detail: bool = False) -> dict[str, Any]:
    exp = session.get(Experiment, job.experiment_id)
    ws = session.get(Workspace, job.workspace_id)
    c = session.get(Cluster, job.cluster_id)
    spec = JobSpec.model_validate(job.spec)
    end = job.ended_at or now()
    data: dict[str, Any] = {
        "id": job.id,
        "name": job.name,
        "workspace": ws.name if ws else None,
        "experiment": exp.name if exp else None,
        "cluster": c.name.split("~deleted-")[0] if c else None,
        "state": job.state,
        "pending_reason": job.pending_reason if job.state == "queued" else None,
        "priority": spec.priority,
        "nodes": spec.nodes,
        "processes_per_node": spec.distribution.processes_per_node,
        "distribution": spec.distribution.type,
        "attempt": job.attempt,
        "exit_code": job.exit_code,
        "message": job.message,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "duration": (end - job.started_at) if job.started_at else None,
        "source_format": job.source_format,
    }
    if detail:
        data["spec"] = spec.redacted()
        attempts = session.scalars(select(Attempt).where(Attempt.job_id == job.id)
                                   .order_by(Attempt.number))
        data["attempts"] = [dict(common.attempt_dict(a), nodes=channel.node_views(session, a))
                            for a in attempts]
        events = session.scalars(select(Event).where(Event.kind == "job",
                                                     Event.entity_id == job.id)
                                 .order_by(Event.id))
        data["events"] = [{"ts": e.ts, "from": e.from_state, "to": e.to_state,
                           "message": e.message} for e in events]
        data["assigned_nodes"] = list(session.scalars(
            select(Node.name).where(Node.job_id == job.id).order_by(Node.index)))
    return data


def find(session: Session, workspace: str, experiment: str, name: str) -> Job:
    ws = common.workspace(session, workspace)
    exp = common.experiment(session, ws, experiment)
    return common.job(session, exp, name)


def show(session: Session, workspace: str, experiment: str, name: str) -> dict[str, Any]:
    return job_dict(session, find(session, workspace, experiment, name), detail=True)


def list_all(session: Session, workspace: str, experiment: str | None = None,
             state: str | None = None, cluster: str | None = None) -> list[dict[str, Any]]:
    ws = common.workspace(session, workspace)
    query = select(Job).where(Job.workspace_id == ws.id)
    if experiment:
        query = query.where(Job.experiment_id == common.experiment(session, ws, experiment).id)
    if state:
        query = query.where(Job.state == state)
    if cluster:
        query = query.where(Job.cluster_id == common.cluster(session, ws, cluster).id)
    return [job_dict(session, j) for j in session.scalars(query.order_by(Job.id))]


def terminate(ctx: ServerContext, session: Session, workspace: str, experiment: str,
              name: str) -> dict[str, Any]:
    """Idempotent: a finished job is returned as it is."""
    job = find(session, workspace, experiment, name)
    if job.state == "queued":
        job.state = "canceled"
        job.ended_at = now()
        job.message = "terminated by user before it started"
        job.pending_reason = None
        common.record(session, "job", job.id, "queued", "canceled", job.message)
    elif job.state in ACTIVE and not job.cancel_requested:
        job.cancel_requested = True
        common.record(session, "job", job.id, job.state, job.state, "terminate requested")
        kick_after_commit(session)
    return job_dict(session, job)


def delete(session: Session, workspace: str, experiment: str, name: str) -> None:
    job = find(session, workspace, experiment, name)
    if job.state not in TERMINAL:
        raise Conflict(f"job {name!r} is {job.state}; terminate it before deleting")
    for attempt in session.scalars(select(Attempt).where(Attempt.job_id == job.id)):
        session.delete(attempt)
    session.delete(job)
    session.flush()
    shutil.rmtree(job.directory, ignore_errors=True)
