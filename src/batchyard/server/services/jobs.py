"""Jobs: submit (validate, check it can ever run, queue), show, list, terminate, delete.
Starting and following attempts is the reconciler's work.

Listing pages by id, newest first (``list_page``: a ``limit`` and an opaque cursor, filters
in SQL, one query per page with the experiment and cluster names joined in); without a limit
``list_all`` answers every job, oldest first, as it always did."""

from __future__ import annotations

import base64
import binascii
import shutil
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Select, bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session

from batchyard.backends import get_backend
from batchyard.backends.base import Gang, has_queue
from batchyard.config import data_root
from batchyard.errors import Conflict, SpecError, Unschedulable
from batchyard.server import queue_mirror
from batchyard.server.context import ServerContext, kick_after_commit
from batchyard.server.services import (
    channel,
    chargeback,
    common,
    keepalive,
    pathcheck,
    storage,
    submit_rows,
)
from batchyard.server.services.clusters import node_info
from batchyard.server.services.stragglers import text as straggler_text
from batchyard.snapshot import digest, pack
from batchyard.spec.cluster import DEFAULT_PIDS
from batchyard.spec.job import PRIORITY_ORDER, JobSpec
from batchyard.states import ATTEMPT_ACTIVE, JOB_ACTIVE, JOB_TERMINAL
from batchyard.storage.secrets import seal_spec, unseal_spec
from batchyard.store.db import begin_write, is_sqlite
from batchyard.store.models import Attempt, Cluster, Event, Experiment, Job, Node, Workspace, now
from batchyard.store.specjson import spec_error

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

    queues = has_queue(get_backend(c.backend))  # Slurm: its partition's nodes
    elastic = not c.spec.get("autoscale") and is_discovered(c) and not queues  # Ray
    if queues:
        max_nodes = c.target_nodes
    # a manually scaled cluster resized to 0 (parked, seed 000's last step) queues the job
    # until it is resized, as Batch AI did; the scheduler's reason says so
    parked = not c.spec.get("autoscale") and not queues and max_nodes == 0
    if spec.nodes > max_nodes and not elastic and not parked:
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
    ceiling = int(c.spec.get("max_pids") or DEFAULT_PIDS)
    if spec.limits.max_pids is not None and spec.limits.max_pids > ceiling:
        raise SpecError(f"limits.max_pids: {spec.limits.max_pids} exceeds the {ceiling} "
                        f"processes a job may have per node on cluster {c.name!r} (max_pids)")
    _check_runtime(spec, c)


def _check_runtime(spec: JobSpec, c: Cluster) -> None:
    """A container job needs nodes with a runtime. A node that has not said (a Slurm node,
    one not probed yet) may have one: only nodes that were probed and have none count."""
    image = spec.environment.image
    if not image:
        return
    session = object_session(c)
    if session is None:
        return
    probed = [n for n in session.scalars(select(Node).where(Node.cluster_id == c.id))
              if "containers" in (n.resources or {})]
    if probed and not any(n.resources.get("containers") for n in probed):
        raise Unschedulable(
            f"environment.image: the job runs in the image {image}, but no node of cluster "
            f"{c.name!r} has a container runtime (Docker or Podman): install one on the nodes "
            "or run the job without an image")


def _code(ctx: ServerContext, spec: JobSpec, session: Session, workspace: str) -> str | None:
    if not spec.code:
        return None
    if spec.code.startswith("snapshot:"):
        sha = spec.code.split(":", 1)[1]
        if not (ctx.snapshots / f"{sha}.tar.gz").is_file():
            raise SpecError(f"code: snapshot {sha[:12]} was never uploaded")
        return sha
    path = Path(spec.code)
    if path.is_absolute():  # packed here, by the server: never its home or a credential
        pathcheck.roots(session, workspace, ctx.tls_files).check(spec.code, "code")
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
           source_format: str = "native", dry_run: bool = False,
           array: tuple[str, int] | None = None,
           created_by: str | None = None) -> dict[str, Any]:
    """Queue one job (``array``: as index N of that job array), recording who submitted
    it; a spec with ``array:`` is expanded into its jobs (services.arrays)."""
    if spec.array and array is None:
        from batchyard.server.services import arrays

        return arrays.submit(ctx, session, workspace, spec, experiment=experiment,
                             cluster=cluster, name=name, source_format=source_format,
                             dry_run=dry_run, created_by=created_by)
    exp_name = experiment or spec.experiment or common.DEFAULT
    job_name = name or spec.name or f"job-{uuid.uuid4().hex[:8]}"
    found = submit_rows.workspace_and_cluster(session, workspace, spec, cluster, exp_name,
                                              job_name)
    ws, c = found.workspace, found.cluster
    check_fits(spec, c)
    common.check_name("job", job_name)
    sha = _code(ctx, spec, session, ws.name)
    stored = spec.model_dump(mode="json", exclude_none=True)
    pathcheck.check_spec(session, ws.name, stored, ctx.tls_files)
    stored["cluster"] = c.name
    stored["experiment"] = exp_name
    stored["name"] = job_name
    if sha:
        stored["code"] = f"snapshot:{sha}"
    storage.check(session, ws.id, stored)
    stored, sealed = seal_spec(stored)
    if dry_run:
        return dry_run_text(ctx, session, ws, exp_name, job_name, stored, c)
    # One writer from here to the commit (SQLite): the submit queues for the write lock now,
    # in arrival order, instead of meeting it at its first INSERT; and the experiment and
    # name checks below cannot race another submit of the same names.
    begin_write(session)
    exp, taken = submit_rows.experiment_for(session, found, exp_name, job_name,
                                            insert_decides=not spec.depends_on)
    if taken:
        raise Conflict(f"job {job_name!r} already exists in experiment {exp_name!r}")
    directory = job_dir(ws.name, exp.name, job_name)
    from batchyard.server.services.arrays import resolve_dependencies

    depends = resolve_dependencies(session, ws, exp, spec.depends_on)
    team = chargeback.team_of(session, created_by)
    values = dict(workspace_id=ws.id, experiment_id=exp.id, cluster_id=c.id, name=job_name,
                  spec=stored, source_format=source_format, state="queued",
                  pending_reason="waiting for the scheduler",
                  priority=PRIORITY_ORDER[spec.priority], directory=str(directory),
                  submitted_at=now(), sealed=sealed or None,
                  array_name=array[0] if array else None,
                  array_index=array[1] if array else None, depends_on=depends or None,
                  created_by=created_by, team=team)
    job = submit_rows.insert_job(session, values, c.name)
    if job is None:
        raise Conflict(f"job {job_name!r} already exists in experiment {exp_name!r}")
    kick_after_commit(session)
    return chargeback.with_warning(session, team, job_dict(session, job))


def _experiment(session: Session, ws: Workspace, name: str) -> Experiment:
    """The experiment, created when missing. On SQLite the caller holds the write lock, so
    nobody else can create it meanwhile; elsewhere two submits may race to create it, and
    the loser takes the winner's."""
    if is_sqlite(session):
        return common.experiment(session, ws, name, create=True)
    found = session.scalar(select(Experiment).where(Experiment.workspace_id == ws.id,
                                                    Experiment.name == name))
    if found is not None:
        return found
    try:
        with session.begin_nested():
            return common.experiment(session, ws, name, create=True)
    except IntegrityError:
        return common.experiment(session, ws, name)


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
                code_archive=None, server_url=ctx.node_url or ctx.api_url,
                launch_tokens=["***"] * len(nodes), cluster_spec=dict(c.spec),
                cluster_size=dict(c.size), hidden=channel.server_hidden(ctx))
    text = get_backend(c.backend).dry_run(gang)
    return {"dry_run": True, "name": job_name, "cluster": c.name, "experiment": exp,
            "spec": JobSpec.model_validate(stored).redacted(), "plan": text}


def launch_spec(session: Session, job: Job, experiment: str) -> dict[str, Any]:
    """The spec the backend gets: secrets unsealed, storage resolved to stores with
    credentials (it goes into the node plans, mode 0600, and nowhere else)."""
    from batchyard.server.services.autostorage import add_auto_storage

    full = unseal_spec(job.spec, job.sealed)
    resolved = storage.resolve(session, job.workspace_id, full,
                               job_path=f"{experiment}/{job.name}")
    from batchyard.server.mlflow.settings import plan_settings
    from batchyard.server.services.gpu_usage import observe_settings

    launch = add_auto_storage(session, job, resolved)
    # what the node plan gets besides the spec: MLflow's variables, GPU sampling
    return {**launch, "mlflow": plan_settings(session, job, experiment),
            "observe": observe_settings()}


def new_attempt(session: Session, job: Job, nodes: list[Node]) -> Attempt:
    number = job.attempt + 1
    attempt_uuid = str(uuid.uuid4())
    attempt = Attempt(job_id=job.id, number=number, uuid=attempt_uuid, state="launching",
                      node_ids=[n.id for n in nodes],
                      directory=str(Path(job.directory) / attempt_uuid), created_at=now())
    session.add(attempt)
    job.attempt = number
    return attempt


def _spec_summary(stored: dict[str, Any]) -> tuple[str, int, int, str]:
    """(priority, nodes, processes per node, distribution) of a stored spec. Submit stores
    the validated spec with its defaults filled in, so they are read straight from it; a row
    missing one is validated as before."""
    try:
        dist = stored["distribution"]
        return (str(stored["priority"]), int(stored["nodes"]), int(dist["processes_per_node"]),
                str(dist["type"]))
    except (KeyError, TypeError, ValueError):
        pass
    try:
        spec = JobSpec.model_validate(stored)
    except ValueError:  # a row no version of the spec reads (an older server's): shown as is
        dist = stored.get("distribution")
        dist = dist if isinstance(dist, dict) else {}
        return (str(stored.get("priority", "?")), _count(stored.get("nodes")),
                _count(dist.get("processes_per_node")), str(dist.get("type", "?")))
    return (spec.priority, spec.nodes, spec.distribution.processes_per_node,
            spec.distribution.type)


def _count(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _summary(job: Job, workspace: str | None, experiment: str | None,
             cluster: str | None) -> dict[str, Any]:
    unread = spec_error(job.spec)
    priority, nodes, ppn, distribution = ("?", 0, 0, "?") if unread else \
        _spec_summary(job.spec)
    end = job.ended_at or now()
    data = {
        "id": job.id,
        "name": job.name,
        "workspace": workspace,
        "experiment": experiment,
        "cluster": cluster.split("~deleted-")[0] if cluster is not None else None,
        "state": job.state,
        "pending_reason": job.pending_reason if job.state in ("queued", "failed") else None,
        "priority": priority,
        "nodes": nodes,
        "processes_per_node": ppn,
        "distribution": distribution,
        "attempt": job.attempt,
        "exit_code": job.exit_code,
        "message": job.message,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "duration": (end - job.started_at) if job.started_at else None,
        "source_format": job.source_format,
        "array": job.array_name,  # the job array it is one index of, if any
        "array_index": job.array_index,
        "created_by": job.created_by,  # the user or service account that submitted it
    }
    if unread:  # a row no version wrote readably (by hand, a bad restore): shown, not a 500
        data["spec_error"] = unread
    return data


def capacity(job: Job, attempts: list[dict[str, Any]]) -> str | None:
    """Whether it runs on another team's guaranteed capacity, or its last attempt was
    preempted to give that back (issue 35 §2); None otherwise."""
    from batchyard.scheduler.guarantees import RECLAIMED, borrowed_text

    last = attempts[-1] if attempts else None
    if last is not None and last["state"] in ("preempted", "stopping") and \
            (last.get("message") or "").startswith(RECLAIMED):
        return str(last["message"])
    if job.borrowed_from and job.state in ("preparing", "running", "finalizing"):
        return borrowed_text(job.borrowed_from)
    return None


# Built once (bound parameters): building a select cost about as much as running it.
_ATTEMPTS_OF_JOB = (select(Attempt).where(Attempt.job_id == bindparam("job_id"))
                    .order_by(Attempt.number))
_EVENTS_OF_JOB = (select(Event.ts, Event.from_state, Event.to_state, Event.message)
                  .where(Event.kind == "job", Event.entity_id == bindparam("job_id"))
                  .order_by(Event.id))
_NODES_OF_JOB = (select(Node.name).where(Node.job_id == bindparam("job_id"))
                 .order_by(Node.index))


def job_dict(session: Session, job: Job, *, detail: bool = False) -> dict[str, Any]:
    exp = session.get(Experiment, job.experiment_id)
    ws = session.get(Workspace, job.workspace_id)
    c = session.get(Cluster, job.cluster_id)
    data = _summary(job, ws.name if ws else None, exp.name if exp else None,
                    c.name if c else None)
    if detail:
        data["error"] = job.error  # the failure cause: cause, rank, node, exit_code, lines
        try:
            if "spec_error" in data:
                raise ValueError(data["spec_error"])
            data["spec"] = JobSpec.model_validate(job.spec).redacted()
        except ValueError as exc:  # a row no version of the spec reads: never shown raw
            data["spec"] = None
            data["spec_error"] = str(exc).splitlines()[0]
        ids = {"job_id": job.id}
        data["attempts"] = [dict(common.attempt_dict(a), nodes=channel.node_views(session, a))
                            for a in session.scalars(_ATTEMPTS_OF_JOB, ids)]
        latest = data["attempts"][-1] if data["attempts"] else {}
        data["straggler"] = latest.get("straggler")  # a rank slower than the others (§5)
        data["straggler_text"] = straggler_text(data["straggler"])
        data["events"] = [{"ts": e.ts, "from": e.from_state, "to": e.to_state,
                           "message": e.message}
                          for e in session.execute(_EVENTS_OF_JOB, ids)]
        data["capacity"] = capacity(job, data["attempts"])
        data["checkpoint"] = job.checkpoint  # {at, step}: batchyard.checkpoint_saved
        data["depends_on"] = [{"job": d["job"], "condition": d["condition"]}
                              for d in (job.depends_on or [])]
        data["assigned_nodes"] = list(session.scalars(_NODES_OF_JOB, ids))
        from batchyard.server.mlflow.settings import job_view
        from batchyard.server.services import gpu_usage

        data["params"] = dict(job.params or {})  # logged by the job (MLflow's log_param)
        data["mlflow"] = job_view(job, ws, exp)
        data["gpu_usage"] = gpu_usage.from_attempts(data["attempts"])
    return data


def find(session: Session, workspace: str, experiment: str, name: str) -> Job:
    found = common.job_by_names(session, workspace, experiment, name)
    if found is not None:
        return found
    ws = common.workspace(session, workspace)  # which one is missing, as it always said
    exp = common.experiment(session, ws, experiment)
    return common.job(session, exp, name)


def show(session: Session, workspace: str, experiment: str, name: str) -> dict[str, Any]:
    return job_dict(session, find(session, workspace, experiment, name), detail=True)


DEFAULT_PAGE = 100
MAX_PAGE = 1000
_CURSOR_PREFIX = "j1:"


def encode_cursor(job_id: int) -> str:
    """Opaque to clients: where the next page starts (after the job with this id)."""
    raw = f"{_CURSOR_PREFIX}{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if raw.startswith(_CURSOR_PREFIX):
            value = int(raw[len(_CURSOR_PREFIX):])
            if 0 < value < 2 ** 63:
                return value
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise SpecError("cursor: not a cursor this server handed out (pass the X-Next-Cursor of "
                    "the previous page as it came)")


def _listing(session: Session, workspace: str, experiment: str | None, state: str | None,
             cluster: str | None, created_by: str | None = None
             ) -> tuple[Workspace, Select[Job, str, str]]:
    ws = common.workspace(session, workspace)
    query = (select(Job, Experiment.name, Cluster.name)
             .outerjoin(Experiment, Experiment.id == Job.experiment_id)
             .outerjoin(Cluster, Cluster.id == Job.cluster_id)
             .where(Job.workspace_id == ws.id))
    if experiment:
        query = query.where(Job.experiment_id == common.experiment(session, ws, experiment).id)
    if state:
        query = query.where(Job.state == state)
    if cluster:
        query = query.where(Job.cluster_id == common.cluster(session, ws, cluster).id)
    if created_by:
        query = query.where(Job.created_by == created_by)
    return ws, query


def list_all(session: Session, workspace: str, experiment: str | None = None,
             state: str | None = None, cluster: str | None = None,
             created_by: str | None = None) -> list[dict[str, Any]]:
    """Every job that matches, oldest first (what clients without paging get)."""
    ws, query = _listing(session, workspace, experiment, state, cluster, created_by)
    return [_summary(j, ws.name, exp, c) for j, exp, c in session.execute(query.order_by(Job.id))]


def list_page(session: Session, workspace: str, experiment: str | None = None,
              state: str | None = None, cluster: str | None = None,
              created_by: str | None = None, *,
              limit: int = DEFAULT_PAGE, cursor: str | None = None
              ) -> tuple[list[dict[str, Any]], str | None]:
    """One page of jobs, newest first, and the cursor of the next page (None at the end).
    Keyset paging on the id: stable while jobs are submitted or deleted meanwhile."""
    if not 1 <= limit <= MAX_PAGE:
        raise SpecError(f"limit: between 1 and {MAX_PAGE}")
    ws, query = _listing(session, workspace, experiment, state, cluster, created_by)
    if cursor:
        query = query.where(Job.id < decode_cursor(cursor))
    rows = list(session.execute(query.order_by(Job.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    page = [_summary(j, ws.name, exp, c) for j, exp, c in rows]
    return page, (encode_cursor(rows[-1][0].id) if more and rows else None)


def terminate(ctx: ServerContext, session: Session, workspace: str, experiment: str,
              name: str) -> dict[str, Any]:
    """Idempotent: a finished job is returned as it is."""
    begin_write(session)  # the state read below cannot change (a placement) before the commit
    job = find(session, workspace, experiment, name)
    handed_over = job.state == "queued" and session.scalar(
        select(Attempt.id).where(Attempt.job_id == job.id, Attempt.state.in_(ATTEMPT_ACTIVE)))
    if job.state == "queued" and handed_over:  # waiting in Slurm's queue: scancel it
        if not job.cancel_requested:
            job.cancel_requested = True
            common.record(session, "job", job.id, job.state, job.state, "terminate requested")
            kick_after_commit(session)
    elif job.state == "queued":
        job.state = "canceled"
        job.ended_at = now()
        job.message = "terminated by user before it started"
        job.pending_reason = None
        common.record(session, "job", job.id, "queued", "canceled", job.message)
        queue_mirror.changed(session, job.id)
    elif job.state in ACTIVE and not job.cancel_requested:
        job.cancel_requested = True
        common.record(session, "job", job.id, job.state, job.state, "terminate requested")
        kick_after_commit(session)
    elif job.state in TERMINAL and keepalive.terminate(session, job):  # held for job exec
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
