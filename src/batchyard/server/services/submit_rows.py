"""The rows a submit reads and writes, in as few statements as the answers allow.

A submit used to look up its workspace, its cluster, its experiment and whether its name was
taken one query each, and wrote its event through the unit of work (a second flush at the
commit). Every statement costs the server about as much CPU as parsing the request: the
workspace and the cluster now come in one query, the experiment and whether the name is
taken in another, and the event is one INSERT. The errors, and the order they are found
in, are the same as before.

The statements are built once, with bound parameters: building a select (its clauses, their
coercions, its cache key) cost about as much as running it, ~0.3 ms of a submit's 1.2. The
job and its event are Core INSERTs: the ORM's unit of work around one new row was another
~0.4 ms."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, and_, bindparam, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from batchyard.errors import NotFound, SpecError
from batchyard.server.services import common
from batchyard.spec.job import JobSpec
from batchyard.store.db import is_sqlite
from batchyard.store.models import Cluster, Event, Experiment, Job, Workspace, now

_WORKSPACE_AND_CLUSTER = (
    select(Workspace, Cluster)
    .outerjoin(Cluster, and_(Cluster.workspace_id == Workspace.id,
                             Cluster.name == bindparam("cluster"),
                             Cluster.deleting.is_(False)))
    .where(Workspace.name == bindparam("workspace")))
_TAKEN = select(Job.id).where(Job.experiment_id == Experiment.id,
                              Job.name == bindparam("job")).exists()
_EXPERIMENT_AND_TAKEN = select(Experiment, _TAKEN).where(
    Experiment.workspace_id == bindparam("workspace_id"),
    Experiment.name == bindparam("experiment"))
_INSERT_JOB = insert(Job.__table__)  # type: ignore[arg-type]
# Elsewhere than SQLite two submits of one name may race: the unique constraint decides, in
# the INSERT itself (a savepoint around it cost two more round trips a submit).
_INSERT_JOB_ONCE = (pg_insert(Job.__table__)  # type: ignore[arg-type]
                    .on_conflict_do_nothing(index_elements=["experiment_id", "name"])
                    .returning(Job.__table__.c.id))
_JOB_DEFAULTS = {c.name: c.default.arg for c in Job.__table__.columns
                 if c.default is not None and c.default.is_scalar}
_INSERT_EVENT = insert(Event.__table__)  # type: ignore[arg-type]


def workspace_and_cluster(session: Session, workspace: str, spec: JobSpec,
                          name: str | None) -> tuple[Workspace, Cluster]:
    """The workspace (the default one made when missing) and the cluster the job runs on:
    the named one, or the workspace's only cluster."""
    wanted = name or spec.cluster
    if wanted:
        row = session.execute(_WORKSPACE_AND_CLUSTER,
                              {"cluster": wanted, "workspace": workspace}).first()
        if row is not None:
            ws, c = row
            if c is None:
                raise NotFound(f"cluster {wanted!r} not found in workspace {ws.name!r}")
            return ws, c
    ws = common.workspace(session, workspace)  # missing: made (default) or NotFound
    if wanted:
        return ws, common.cluster(session, ws, wanted)
    clusters = list(session.scalars(select(Cluster).where(Cluster.workspace_id == ws.id,
                                                          Cluster.deleting.is_(False))))
    if len(clusters) == 1:
        return ws, clusters[0]
    raise SpecError("cluster: name the cluster to run on (-c/--cluster or `cluster:` in the "
                    f"job file); workspace {ws.name!r} has {len(clusters)} clusters")


def experiment_for(session: Session, ws: Workspace, name: str,
                   job_name: str) -> tuple[Experiment, bool]:
    """(the experiment, created when missing; whether it has a job called ``job_name``).
    On SQLite the caller holds the write lock, so nobody else can create either meanwhile;
    elsewhere two submits may race to create the experiment, and the loser takes the
    winner's (the job's unique constraint has the last word on its name there)."""
    params = {"job": job_name, "workspace_id": ws.id, "experiment": name}
    row = session.execute(_EXPERIMENT_AND_TAKEN, params).first()
    if row is not None:
        return row[0], bool(row[1])
    if is_sqlite(session):
        return common.experiment(session, ws, name, create=True), False
    try:
        with session.begin_nested():
            return common.experiment(session, ws, name, create=True), False
    except IntegrityError:
        row = session.execute(_EXPERIMENT_AND_TAKEN, params).first()
        if row is None:
            raise
        return row[0], bool(row[1])


def insert_job(session: Session, values: dict[str, Any]) -> Job | None:
    """The job's row, INSERTed; answered as a Job that no session holds (for its answer).
    None when another submit took the name first (PostgreSQL; on SQLite the caller holds
    the write lock and has checked the name)."""
    values = _JOB_DEFAULTS | values  # the answer's Job: a row's defaults, as a flush sets
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        made = session.execute(_INSERT_JOB_ONCE, values).scalar()
        return None if made is None else Job(id=made, **values)
    if dialect != "sqlite":  # another database: the constraint's error, in a savepoint
        try:
            with session.begin_nested():
                result = cast(CursorResult[Any], session.execute(_INSERT_JOB, values))
        except IntegrityError:
            return None
    else:
        result = cast(CursorResult[Any], session.execute(_INSERT_JOB, values))
    key = result.inserted_primary_key
    assert key is not None
    return Job(id=key[0], **values)


def record_submitted(session: Session, job_id: int, cluster: str) -> None:
    """``common.record`` of the submit, as one INSERT now rather than a flush at commit."""
    session.execute(_INSERT_EVENT, {"kind": "job", "entity_id": job_id, "from_state": None,
                                    "to_state": "queued", "ts": now(),
                                    "message": f"submitted to cluster {cluster}"})
