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
~0.4 ms.

On PostgreSQL a submit is two statements and the commit: the workspace, the cluster, the
experiment and whether the name is taken in one query (read before anything is written: the
job's unique constraint, not a lock, has the last word there), and the job with its event in
one INSERT (a data-modifying WITH). SQLite has no such WITH, and checks the name under its
write lock; it keeps the four statements."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, cast

from sqlalchemy import CursorResult, Insert, String, and_, bindparam, insert, literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from batchyard.errors import SpecError
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
# PostgreSQL: the experiment and whether the name is taken, read with the cluster
_EVERYTHING_OF_A_SUBMIT = (
    _WORKSPACE_AND_CLUSTER.add_columns(Experiment, _TAKEN)
    .outerjoin(Experiment, and_(Experiment.workspace_id == Workspace.id,
                                Experiment.name == bindparam("experiment"))))
_INSERT_JOB = insert(Job.__table__)  # type: ignore[arg-type]
_INSERT_JOB_SQLITE = sqlite_insert(Job.__table__).on_conflict_do_nothing(  # type: ignore[arg-type]
    index_elements=["experiment_id", "name"])
_JOB_DEFAULTS = {c.name: c.default.arg for c in Job.__table__.columns
                 if c.default is not None and c.default.is_scalar}
_INSERT_EVENT = insert(Event.__table__)  # type: ignore[arg-type]
_ROWS_READ = "submit_rows.read"


class Found(NamedTuple):
    workspace: Workspace
    cluster: Cluster
    # PostgreSQL: the experiment (None when it does not exist yet) and whether it has a job
    # of that name, read with the cluster; None on SQLite (``experiment_for`` reads them
    # under the write lock)
    experiment: tuple[Experiment | None, bool] | None = None


def workspace_and_cluster(session: Session, workspace: str, spec: JobSpec,
                          name: str | None, experiment: str, job_name: str) -> Found:
    """The workspace (the default one made when missing) and the cluster the job runs on:
    the named one, or the workspace's only cluster."""
    wanted = name or spec.cluster
    rows = _read_in_this_transaction(session)
    known = rows.get(("cluster", workspace, wanted))
    if known is not None:  # submits written together (server/batching.py) read them once
        return Found(*known)
    found = _workspace_and_cluster(session, workspace, wanted, experiment, job_name)
    rows[("cluster", workspace, wanted)] = (found.workspace, found.cluster)
    return found


def _read_in_this_transaction(session: Session) -> dict[Any, Any]:
    """The workspaces, clusters and experiments this transaction has read: they stand until
    it ends (a session that outlives it starts afresh)."""
    transaction = session.get_transaction()
    if transaction is None:  # not begun yet: nothing read in it to keep
        return {}
    held = session.info.get(_ROWS_READ)
    if held is None or held[0] is not transaction:
        held = session.info[_ROWS_READ] = (transaction, {})
    return cast(dict[Any, Any], held[1])


def _workspace_and_cluster(session: Session, workspace: str, wanted: str | None,
                           experiment: str, job_name: str) -> Found:
    if wanted:
        pg = session.get_bind().dialect.name == "postgresql"
        params = {"cluster": wanted, "workspace": workspace}
        if pg:
            params |= {"experiment": experiment, "job": job_name}
        row = session.execute(_EVERYTHING_OF_A_SUBMIT if pg else _WORKSPACE_AND_CLUSTER,
                              params).first()
        if row is not None:
            ws, c = row[0], row[1]
            if c is None:
                raise common.cluster_not_found(session, ws, wanted)
            return Found(ws, c, (row[2], bool(row[3])) if pg else None)
    ws = common.workspace(session, workspace)  # missing: made (default) or NotFound
    if wanted:
        return Found(ws, common.cluster(session, ws, wanted))
    clusters = list(session.scalars(select(Cluster).where(Cluster.workspace_id == ws.id,
                                                          Cluster.deleting.is_(False))))
    if len(clusters) == 1:
        return Found(ws, clusters[0])
    raise SpecError("cluster: name the cluster to run on (-c/--cluster or `cluster:` in the "
                    f"job file); workspace {ws.name!r} has {len(clusters)} clusters")


def experiment_for(session: Session, found: Found, name: str, job_name: str, *,
                   insert_decides: bool = False) -> tuple[Experiment, bool]:
    """(the experiment, created when missing; whether it has a job called ``job_name``).
    On SQLite the caller holds the write lock, so nobody else can create either meanwhile;
    elsewhere two submits may race to create the experiment, and the loser takes the
    winner's (the job's unique constraint has the last word on its name there).

    ``insert_decides``: nothing that can fail comes between this and the job's INSERT, so
    the INSERT may answer whether the name is taken (``insert_job``: None). An experiment
    this transaction has read already (submits written together) is then taken with no
    query at all; the error is the same, found at the same point."""
    ws = found.workspace
    known = _read_in_this_transaction(session)
    if insert_decides and (exp := known.get(("experiment", ws.id, name))) is not None:
        return exp, False
    exp, taken = _experiment_and_taken(session, found, name, job_name)
    known[("experiment", ws.id, name)] = exp
    return exp, taken


def _experiment_and_taken(session: Session, found: Found, name: str,
                          job_name: str) -> tuple[Experiment, bool]:
    ws = found.workspace
    if found.experiment is not None and found.experiment[0] is not None:
        return found.experiment[0], found.experiment[1]  # read with the cluster
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


def insert_job(session: Session, values: dict[str, Any], cluster: str) -> Job | None:
    """The job's row and its ``submitted`` event, INSERTed; the job answered as a Job that no
    session holds (for its answer). None when the name is taken: another submit took it
    first (PostgreSQL), or nobody checked it before (``experiment_for``'s
    ``insert_decides``)."""
    values = _JOB_DEFAULTS | values  # the answer's Job: a row's defaults, as a flush sets
    event = {"event_ts": now(), "event_message": f"submitted to cluster {cluster}"}
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        made = session.execute(_job_and_event_once(tuple(sorted(values))),
                               values | event).scalar()
        return None if made is None else Job(id=made, **values)
    if dialect != "sqlite":  # another database: the constraint's error, in a savepoint
        try:
            with session.begin_nested():
                result = cast(CursorResult[Any], session.execute(_INSERT_JOB, values))
        except IntegrityError:
            return None
    else:
        result = cast(CursorResult[Any], session.execute(_INSERT_JOB_SQLITE, values))
        if result.rowcount == 0:  # the name is taken (experiment_for's insert_decides)
            return None
    key = result.inserted_primary_key
    assert key is not None
    session.execute(_INSERT_EVENT, {"kind": "job", "entity_id": key[0], "from_state": None,
                                    "to_state": "queued", "ts": event["event_ts"],
                                    "message": event["event_message"]})
    return Job(id=key[0], **values)


@functools.cache
def _job_and_event_once(columns: tuple[str, ...]) -> Insert:
    """``INSERT`` the job unless its name is taken, and its event with it: one statement.
    Two submits of one name may race here: the unique constraint decides, in the INSERT
    itself (a savepoint around it cost two more round trips a submit). Built once per set
    of columns a submit fills."""
    jobs, events = Job.__table__, Event.__table__
    made = (pg_insert(jobs)  # type: ignore[arg-type]
            .values({c: bindparam(c, type_=jobs.c[c].type) for c in columns})
            .on_conflict_do_nothing(index_elements=["experiment_id", "name"])
            .returning(jobs.c.id).cte("made"))
    return (insert(events)  # type: ignore[arg-type]
            .from_select(["kind", "entity_id", "from_state", "to_state", "ts", "message"],
                         select(literal("job"), made.c.id, literal(None, String),
                                literal("queued"),
                                bindparam("event_ts", type_=events.c.ts.type),
                                bindparam("event_message", type_=events.c.message.type)))
            .returning(events.c.entity_id))
