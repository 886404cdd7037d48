"""ORM tables. The database is the single source of truth: the server may die at any moment
and the reconciler rebuilds everything it needs from these rows."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from batchyard.store.specjson import SpecJSON


def now() -> float:
    return time.time()


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Workspace(Base):
    __tablename__ = "workspaces"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    location: Mapped[str | None] = mapped_column(String(64))
    subscription_id: Mapped[str | None] = mapped_column(String(128))
    resource_group: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float, default=now)
    # An external MLflow tracking server its jobs' ranks log to (None: batchyard's own)
    mlflow_uri: Mapped[str | None] = mapped_column(Text)


class Cluster(Base):
    __tablename__ = "clusters"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    size: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), default="steady")
    target_nodes: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    deleting: Mapped[bool] = mapped_column(Boolean, default=False)
    nodes: Mapped[list[Node]] = relationship(back_populates="cluster", order_by="Node.index")


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    index: Mapped[int] = mapped_column(Integer)
    address: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default="preparing")
    reason: Mapped[str | None] = mapped_column(Text)
    resources: Mapped[dict[str, Any]] = mapped_column(JSON)
    directory: Mapped[str] = mapped_column(Text)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    ready_at: Mapped[float | None] = mapped_column(Float)
    idle_since: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    # Machines joined by `batchyard agent`: their own credential (hashed), the machine id that
    # makes a re-join idempotent, and the last heartbeat.
    machine_id: Mapped[str | None] = mapped_column(String(64))
    credential_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)
    # The latest utilisation sample its agent sent (CPU, memory, GPUs), for /metrics
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Periodic health checks (server/services/health.py): the last result, passes in a row,
    # recent pre-flight failures and an admin's hold
    health: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    cluster: Mapped[Cluster] = relationship(back_populates="nodes")


class Experiment(Base):
    __tablename__ = "experiments"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float, default=now)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("experiment_id", "name"),
                      Index("ix_jobs_workspace_newest", "workspace_id", "id"),
                      Index("ix_jobs_workspace_created_by", "workspace_id", "created_by"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    # decoded row by row, never raising: one unreadable spec is that job's trouble alone
    spec: Mapped[dict[str, Any]] = mapped_column(SpecJSON)
    source_format: Mapped[str] = mapped_column(String(16), default="native")
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    pending_reason: Mapped[str | None] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer, default=1)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    token_hash: Mapped[str | None] = mapped_column(String(64))
    submitted_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    directory: Mapped[str] = mapped_column(Text)
    # Secret values and storage keys of the spec, sealed (storage.crypto); ``spec`` holds
    # them masked.
    sealed: Mapped[str | None] = mapped_column(Text)
    # Job arrays and dependencies (issue 17): the array this job is one index of, what it
    # waits for ([{job_id, job, condition}], resolved at submit), and the words a stop
    # requested by batchyard itself (a sweep's early termination) ends it with.
    array_name: Mapped[str | None] = mapped_column(String(64), index=True)
    array_index: Mapped[int | None] = mapped_column(Integer)
    depends_on: Mapped[list[Any] | None] = mapped_column(JSON)
    stop_reason: Mapped[str | None] = mapped_column(Text)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the failure cause
    # The user or service account that submitted it (None: before identities existed)
    created_by: Mapped[str | None] = mapped_column(String(128))
    # The submitter's team then (the usage report keeps it when the team is removed)
    team: Mapped[str | None] = mapped_column(String(64))
    # the team whose idle guaranteed capacity its running attempt borrows (issue 35 §2)
    borrowed_from: Mapped[str | None] = mapped_column(String(64))
    # the last checkpoint a rank reported complete ({at, step}: batchyard.checkpoint_saved),
    # kept across attempts: victims are chosen by the work since (issue 36 §2)
    checkpoint: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Parameters logged by the job (MLflow's log_param), and what else MLflow calls keep of
    # its run (logged models)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    mlflow: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("job_id", "number"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(36), unique=True)
    state: Mapped[str] = mapped_column(String(16), default="launching", index=True)
    node_ids: Mapped[list[Any]] = mapped_column(JSON)
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    directory: Mapped[str] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str | None] = mapped_column(Text)
    cancel_reason: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the failure cause
    # What the launchers are told over the node channel: cancel/abort/finish, bumped with
    # ``control_version`` so their long polls wake; ``rendezvous`` holds ports node 0 chose.
    control: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # a rank whose steps are slower than the gang's median (server/services/stragglers.py)
    straggler: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    control_version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)


class Event(Base):
    """Append-only log of state changes, for `job show` history and audits."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, default=now, index=True)
    kind: Mapped[str] = mapped_column(String(16))
    entity_id: Mapped[int] = mapped_column(Integer, index=True)
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str | None] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text)


class Metric(Base):
    """One value logged by a job (``run.log``, ``batchyard.log_metric``): a float in ``value``,
    or JSON in ``data`` for lists, rows, tables, strings and non-finite numbers."""

    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_job_name", "job_id", "name"),
                      Index("ix_metrics_job_batch", "job_id", "batch_id"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16), default="scalar")
    value: Mapped[float | None] = mapped_column(Float)
    data: Mapped[Any | None] = mapped_column(JSON)
    step: Mapped[int | None] = mapped_column(Integer)
    rank: Mapped[int | None] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float, default=now)
    batch_id: Mapped[str | None] = mapped_column(String(64))


class Quota(Base):
    """A workspace's limit for one node family, set by an admin. Families without a row use
    the defaults in server.services.quotas (24 vCPUs for GPU families, as Azure's)."""

    __tablename__ = "quotas"
    __table_args__ = (UniqueConstraint("workspace_id", "family"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    family: Mapped[str] = mapped_column(String(64))
    vcpu_limit: Mapped[int | None] = mapped_column(Integer)
    gpu_limit: Mapped[int | None] = mapped_column(Integer)


class Datastore(Base):
    """Named storage of a workspace. ``config`` holds what may be shown (kind, container,
    endpoint...); the credentials live only in ``sealed`` (storage.crypto)."""

    __tablename__ = "datastores"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    sealed: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class NodeReport(Base):
    """What one node launcher of one attempt last reported over the node channel. ``seq`` is
    the launcher's monotonic report number: a report is applied only if it is newer, so a
    resend after a partition or a server restart changes nothing. ``token_hash`` is the hash
    of the launcher's credential, scoped to exactly this (attempt, node rank)."""

    __tablename__ = "node_reports"
    __table_args__ = (UniqueConstraint("attempt_id", "node_rank"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"),
                                            index=True)
    node_rank: Mapped[int] = mapped_column(Integer)
    node_id: Mapped[int | None] = mapped_column(Integer)
    token_hash: Mapped[str] = mapped_column(String(64), index=True)
    seq: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="starting")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float | None] = mapped_column(Float)
    # the last report of any kind (a resend, a heartbeat): a server taking over fails the
    # attempts whose launchers it never hears from
    heard_at: Mapped[float | None] = mapped_column(Float)


class ServerRow(Base):
    """A server process serving this database, as node launchers reach it: they look for
    the one leading now among these when theirs stops answering (a failover, a restart on
    another port). Refreshed while it runs (``seen_at``), removed when it stops."""

    __tablename__ = "servers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(String(512), unique=True)
    pid: Mapped[int | None] = mapped_column(Integer)
    host: Mapped[str | None] = mapped_column(String(255))
    leading: Mapped[bool] = mapped_column(Boolean, default=False)
    started_at: Mapped[float] = mapped_column(Float, default=now)
    seen_at: Mapped[float] = mapped_column(Float, default=now)


class JoinToken(Base):
    """A cluster-scoped secret an agent trades for its own node credential. Only its hash is
    kept; it expires and can be revoked."""

    __tablename__ = "join_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"),
                                            index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float, default=now)
    expires_at: Mapped[float | None] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)


class NodeCommand(Base):
    """A request for an agent (launch, sweep, exec), taken by its long poll and acked with a
    result; an agent that sees a command id twice does nothing the second time."""

    __tablename__ = "node_commands"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"),
                                         index=True)
    kind: Mapped[str] = mapped_column(String(16))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    taken_at: Mapped[float | None] = mapped_column(Float)
    done_at: Mapped[float | None] = mapped_column(Float)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Sweep(Base):
    """A hyperparameter sweep: a parent run whose trials are ordinary jobs. ``spec`` is the
    validated SweepSpec (the trial template inside it, secrets sealed in ``sealed``)."""

    __tablename__ = "sweeps"
    __table_args__ = (UniqueConstraint("experiment_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    sealed: Mapped[str | None] = mapped_column(Text)
    source_format: Mapped[str] = mapped_column(String(16), default="native")
    state: Mapped[str] = mapped_column(String(16), default="running", index=True)
    message: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    ended_at: Mapped[float | None] = mapped_column(Float)
    created_by: Mapped[str | None] = mapped_column(String(128))  # its trials' submitter


class SweepTrial(Base):
    """One trial of a sweep. (sweep_id, index) is unique and the trial's job is created in
    the same transaction as this row, so a server killed at any moment neither loses a
    trial nor runs one twice. ``raw`` holds the sampler's own values (what Optuna saw),
    ``params`` what the job got."""

    __tablename__ = "sweep_trials"
    __table_args__ = (UniqueConstraint("sweep_id", "index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"),
                                          index=True)
    index: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"),
                                               index=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    raw: Mapped[dict[str, Any]] = mapped_column(JSON)
    objective: Mapped[float | None] = mapped_column(Float)
    evaluated_step: Mapped[int | None] = mapped_column(Integer)
    stopped_by: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class IdempotencyKey(Base):
    """A client's key for one submit: a retried request with the same key gets the job the
    first one made instead of a second job. The key's row is written in the transaction that
    creates the job, so the two exist together or not at all."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("workspace_id", "key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"),
                                              index=True)
    key: Mapped[str] = mapped_column(String(200))
    fingerprint: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    array: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # {experiment, name}
    created_at: Mapped[float] = mapped_column(Float, default=now)


class PortalSignIn(Base):
    """A portal sign-in behind a cookie. In the database, not one process's memory: the
    workers of a ``--workers`` server each answer some of a browser's requests. Only the
    sid's sha256 is stored: a copy of the database does not sign anyone in."""

    __tablename__ = "portal_sessions"
    sid_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    csrf: Mapped[str] = mapped_column(String(64))
    expires: Mapped[float] = mapped_column(Float, index=True)
    # who signed in: a user (by a personal token), or the home's token (the admin)
    user_id: Mapped[int | None] = mapped_column(Integer)
    home_token: Mapped[bool] = mapped_column(Boolean, default=False)


class PortalLink(Base):
    """A one-time portal sign-in link (`batchyard portal --open`, as Jupyter's ``?token=``):
    only its token's sha256, consumed (deleted) by the first visit, and short-lived."""

    __tablename__ = "portal_links"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    next_url: Mapped[str] = mapped_column(String(2048))
    expires: Mapped[float] = mapped_column(Float, index=True)
    # who asked for it, whom its visit signs in (as PortalSignIn)
    user_id: Mapped[int | None] = mapped_column(Integer)
    home_token: Mapped[bool] = mapped_column(Boolean, default=False)


from batchyard.store import identity as _identity  # noqa: E402,F401  (its tables, same metadata)
from batchyard.store import sso as _sso  # noqa: E402,F401
