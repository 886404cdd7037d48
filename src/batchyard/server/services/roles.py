"""Role assignments: a role of a user or a team in a workspace (one per holder and
workspace; assigning again replaces it). A workspace keeps at least one owner once it has
had one: removing or demoting the last is refused."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from batchyard.errors import Conflict, NotFound, SpecError
from batchyard.server.security import cache
from batchyard.server.security.principal import Role
from batchyard.server.services import common
from batchyard.server.services.identities import find_team, find_user
from batchyard.store.identity import RoleAssignment, Team, TeamMember, User
from batchyard.store.models import Workspace, now


def _holder(session: Session, user: str | None, team: str | None
            ) -> tuple[str, User | None, Team | None]:
    if bool(user) == bool(team):
        raise SpecError("give either --user or --team (one of them)")
    if user:
        found = find_user(session, user)
        return f"user:{found.id}", found, None
    assert team
    found_team = find_team(session, team)
    return f"team:{found_team.id}", None, found_team


def _row_dict(session: Session, ws: Workspace, row: RoleAssignment) -> dict[str, Any]:
    user = session.get(User, row.user_id) if row.user_id else None
    team = session.get(Team, row.team_id) if row.team_id else None
    return {"workspace": ws.name, "user": user.name if user else None,
            "team": team.name if team else None, "role": row.role,
            "created_at": row.created_at, "created_by": row.created_by}


def list_assignments(session: Session, workspace: str) -> list[dict[str, Any]]:
    ws = common.workspace(session, workspace)
    rows = session.scalars(select(RoleAssignment).where(RoleAssignment.workspace_id == ws.id)
                           .order_by(RoleAssignment.holder))
    found = [_row_dict(session, ws, r) for r in rows]
    return sorted(found, key=lambda r: (-Role[r["role"]], r["user"] or "", r["team"] or ""))


def assign(session: Session, workspace: str, *, user: str | None = None,
           team: str | None = None, role: str, by: str | None = None) -> dict[str, Any]:
    wanted = Role.parse(role)
    ws = common.workspace(session, workspace)
    holder, found_user, found_team = _holder(session, user, team)
    row = session.scalar(select(RoleAssignment).where(RoleAssignment.workspace_id == ws.id,
                                                      RoleAssignment.holder == holder))
    if row is not None and row.role == Role.owner.name and wanted != Role.owner:
        _keep_an_owner(session, ws, holder)
    if row is None:
        row = RoleAssignment(workspace_id=ws.id, holder=holder,
                             user_id=found_user.id if found_user else None,
                             team_id=found_team.id if found_team else None)
        session.add(row)
    row.role, row.created_at, row.created_by = wanted.name, now(), by
    session.flush()
    cache.changed(session)
    return _row_dict(session, ws, row)


def remove(session: Session, workspace: str, *, user: str | None = None,
           team: str | None = None) -> dict[str, Any]:
    ws = common.workspace(session, workspace)
    holder, _, _ = _holder(session, user, team)
    row = session.scalar(select(RoleAssignment).where(RoleAssignment.workspace_id == ws.id,
                                                      RoleAssignment.holder == holder))
    who = f"user {user!r}" if user else f"team {team!r}"
    if row is None:
        raise NotFound(f"{who} has no role in workspace {ws.name!r}")
    if row.role == Role.owner.name:
        _keep_an_owner(session, ws, holder)
    removed = _row_dict(session, ws, row)
    session.delete(row)
    session.flush()
    cache.changed(session)
    return removed


def _keep_an_owner(session: Session, ws: Workspace, leaving: str) -> None:
    others = session.scalar(select(RoleAssignment.id).where(
        RoleAssignment.workspace_id == ws.id, RoleAssignment.role == Role.owner.name,
        RoleAssignment.holder != leaving).limit(1))
    if others is None:
        raise Conflict(f"that is the last owner of workspace {ws.name!r}: assign another owner "
                       "first (`batchyard role assign -w WS --user U --role owner`)")


def grant_at_least(session: Session, workspace: str, user: User, role: str,
                   by: str | None = None) -> None:
    """``user`` holds at least ``role`` in ``workspace`` (made when missing; a higher role
    stays). For single sign-on's group mappings: a workspace that does not exist is
    skipped."""
    wanted = Role.parse(role)
    ws = session.scalar(select(Workspace).where(Workspace.name == workspace))
    if ws is None:
        return
    holder = f"user:{user.id}"
    row = session.scalar(select(RoleAssignment).where(RoleAssignment.workspace_id == ws.id,
                                                      RoleAssignment.holder == holder))
    if row is None:
        session.add(RoleAssignment(workspace_id=ws.id, holder=holder, user_id=user.id,
                                   role=wanted.name, created_at=now(), created_by=by))
    elif Role[row.role] < wanted:
        row.role = wanted.name
    session.flush()
    cache.changed(session)


def grant_creator(session: Session, ws: Workspace, user_id: int | None, by: str) -> None:
    """Whoever creates a workspace owns it (a user: the home's token acts as its OS user)."""
    if user_id is None:
        return
    session.add(RoleAssignment(workspace_id=ws.id, holder=f"user:{user_id}", user_id=user_id,
                               role=Role.owner.name, created_at=now(), created_by=by))
    session.flush()
    cache.changed(session)


def forget_workspace(session: Session, ws: Workspace) -> None:
    """A workspace being deleted takes its assignments with it (a new one of the same name
    starts with none)."""
    session.execute(delete(RoleAssignment).where(RoleAssignment.workspace_id == ws.id))
    cache.changed(session)


def effective(session: Session, user_id: int) -> dict[str, Role]:
    """The user's role in each workspace where they have one: their own, or their teams',
    whichever is higher. One query."""
    teams = select(TeamMember.team_id).where(TeamMember.user_id == user_id)
    rows = session.execute(
        select(Workspace.name, RoleAssignment.role)
        .join(Workspace, Workspace.id == RoleAssignment.workspace_id)
        .where((RoleAssignment.user_id == user_id) | RoleAssignment.team_id.in_(teams)))
    found: dict[str, Role] = {}
    for ws_name, role in rows:
        value = Role[role]
        if found.get(ws_name, 0) < value:
            found[ws_name] = value
    return found


def listing_for(session: Session, user_id: int) -> list[dict[str, Any]]:
    """Where the user has a role and through what (whoami)."""
    teams = dict(session.execute(select(Team.id, Team.name).join(
        TeamMember, TeamMember.team_id == Team.id).where(TeamMember.user_id == user_id))
        .tuples().all())
    rows = session.execute(
        select(Workspace.name, RoleAssignment.role, RoleAssignment.team_id)
        .join(Workspace, Workspace.id == RoleAssignment.workspace_id)
        .where((RoleAssignment.user_id == user_id)
               | RoleAssignment.team_id.in_(list(teams) or [-1])))
    return sorted(({"workspace": ws, "role": role,
                    "via": f"team {teams[team_id]}" if team_id else "direct"}
                   for ws, role, team_id in rows),
                  key=lambda r: (r["workspace"], -Role[r["role"]]))
