"""Tables of people and what they may do (issue 32): users and service accounts, their
personal tokens, teams, role assignments per workspace, and the append-only audit trail.
Imported by ``store.models`` so that one metadata holds every table."""

from __future__ import annotations

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from batchyard.store.models import Base, now


class User(Base):
    """A person or a service account (``service``: for CI, never signs in interactively).
    ``issuer`` and ``subject`` name the user at an OpenID provider when single sign-on made
    or linked it (None: made by an admin)."""

    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("issuer", "subject"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    email: Mapped[str | None] = mapped_column(String(255))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    service: Mapped[bool] = mapped_column(Boolean, default=False)
    disabled_at: Mapped[float | None] = mapped_column(Float)
    issuer: Mapped[str | None] = mapped_column(String(255))
    subject: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float, default=now)
    created_by: Mapped[str | None] = mapped_column(String(64))


class ApiToken(Base):
    """A bearer token of a user. Only its sha256 is kept; ``prefix`` (the first characters
    after ``pat.``) lets its owner tell tokens apart. ``kind``: ``personal`` (made with
    `token create`, lives until it expires or is revoked) or ``login`` (made by a sign-in
    flow for one client, revoked by `batchyard logout`)."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                         index=True)
    name: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16), default="personal")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float, default=now)
    created_by: Mapped[str | None] = mapped_column(String(64))
    expires_at: Mapped[float | None] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)


class Team(Base):
    """``shares``: its part of the machines under fair share, against the other teams'
    (`team set T --shares N`)."""

    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    shares: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")


class TeamMember(Base):
    __tablename__ = "team_members"
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"),
                                         primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                         primary_key=True, index=True)
    shares: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")  # in the team


class Price(Base):
    """What a node of a size costs an hour (`price set`), for the usage report."""

    __tablename__ = "prices"
    size: Mapped[str] = mapped_column(String(64), primary_key=True)
    per_hour: Mapped[float] = mapped_column(Float)
    currency: Mapped[str] = mapped_column(String(8), default="USD")
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class Budget(Base):
    """GPU-hours a team may use per period (day, week, month: calendar, UTC); past it,
    ``action`` warns on submit, or (``hold``) keeps the team's queued jobs waiting."""

    __tablename__ = "budgets"
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"),
                                         primary_key=True)
    gpu_hours: Mapped[float] = mapped_column(Float)
    period: Mapped[str] = mapped_column(String(8))
    action: Mapped[str] = mapped_column(String(8))
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class Guarantee(Base):
    """A team's guaranteed capacity on a cluster (`cluster quota set`), in nodes; what it
    may use beyond (``borrow_limit``, nodes; None: no limit). Issue 35 §2."""

    __tablename__ = "guarantees"
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"),
                                            primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"),
                                         primary_key=True)
    nodes: Mapped[int] = mapped_column(Integer)
    borrow_limit: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class RoleAssignment(Base):
    """One role of one user or one team in one workspace (a second assignment to the same
    holder replaces the first). ``holder`` is ``user:<id>`` or ``team:<id>``: one unique
    column, as NULLs would not make a pair of nullable keys unique."""

    __tablename__ = "role_assignments"
    __table_args__ = (UniqueConstraint("workspace_id", "holder"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"),
                                              index=True)
    holder: Mapped[str] = mapped_column(String(32), index=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float, default=now)
    created_by: Mapped[str | None] = mapped_column(String(64))


class AuditEntry(Base):
    """Who did what to which target, when, from where, and how it ended. Append-only: no
    code path updates or deletes a row. Never holds a secret: credentials are named by kind
    and id (``token:12``, ``home-token``, ``job:7``), never by value."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_actor_ts", "actor", "ts"),
                      Index("ix_audit_log_workspace_ts", "workspace", "ts"),
                      Index("ix_audit_log_client_ts", "client", "ts"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, default=now, index=True)
    actor: Mapped[str] = mapped_column(String(64))
    credential: Mapped[str | None] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(48))
    target: Mapped[str | None] = mapped_column(Text)
    workspace: Mapped[str | None] = mapped_column(String(64))
    client: Mapped[str | None] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(16))
    status: Mapped[int | None] = mapped_column(Integer)
    detail: Mapped[str | None] = mapped_column(Text)
