"""Users, service accounts and teams. What a route may do with them is declared at the
route (security.permissions); these functions only keep the rows right. Every change drops
what the server processes cached of identities (security.cache)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from batchyard.errors import Conflict, NotFound, SpecError
from batchyard.server.security import cache
from batchyard.store.identity import (
    ApiToken,
    Budget,
    Guarantee,
    RoleAssignment,
    Team,
    TeamMember,
    User,
)
from batchyard.store.models import now

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise SpecError(f"{kind} name {name!r} is invalid: use 1-64 letters, digits, '.', '_', "
                        "'@', '+' or '-', starting with a letter or digit")
    return name


def user_dict(user: User, teams: Iterable[str] = ()) -> dict[str, Any]:
    return {"name": user.name, "email": user.email, "admin": user.admin,
            "service": user.service, "disabled": user.disabled_at is not None,
            "disabled_at": user.disabled_at, "created_at": user.created_at,
            "created_by": user.created_by, "sso": user.issuer is not None,
            "teams": sorted(teams)}


def find_user(session: Session, name: str) -> User:
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        raise NotFound(f"user {name!r} not found (`batchyard user list` shows the users)")
    return user


def create_user(session: Session, name: str, *, email: str | None = None, admin: bool = False,
                service: bool = False, by: str | None = None) -> dict[str, Any]:
    check_name("user", name)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise Conflict(f"user {name!r} already exists")
    user = User(name=name, email=email or None, admin=admin, service=service,
                created_at=now(), created_by=by)
    session.add(user)
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError:
        raise Conflict(f"user {name!r} already exists") from None
    cache.changed(session)
    return user_dict(user)


def list_users(session: Session) -> list[dict[str, Any]]:
    teams = _teams_by_user(session)
    return [user_dict(u, teams.get(u.id, ())) for u in
            session.scalars(select(User).order_by(User.name))]


def show_user(session: Session, name: str) -> dict[str, Any]:
    user = find_user(session, name)
    return user_dict(user, _teams_by_user(session, user.id).get(user.id, ()))


def set_disabled(session: Session, name: str, disabled: bool) -> dict[str, Any]:
    """Disable (or enable again) a user: every token of theirs and every portal session
    stops working at once; nothing of theirs is deleted. Idempotent."""
    user = find_user(session, name)
    if disabled and user.disabled_at is None:
        user.disabled_at = now()
    elif not disabled:
        user.disabled_at = None
    cache.changed(session)
    return user_dict(user)


def ensure_owner(session: Session, name: str) -> User:
    """The OS user who runs the server, an admin, made on first use (zero configuration:
    the home's token acts as this user)."""
    user = session.scalar(select(User).where(User.name == name))
    if user is not None:
        return user
    user = User(name=name, admin=True, service=False, created_at=now(),
                created_by="home-token")
    try:
        with session.begin_nested():
            session.add(user)
            session.flush()
    except IntegrityError:  # another server process made it meanwhile
        found = session.scalar(select(User).where(User.name == name))
        assert found is not None
        return found
    cache.changed(session)
    return user


def os_user_name() -> str:
    """The name the server's OS user gets as a batchyard user (made valid if it is not)."""
    import getpass

    try:
        raw = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry, no LOGNAME: a uid in a container
        import os

        raw = f"uid{os.getuid()}"
    name = re.sub(r"[^A-Za-z0-9_.@+-]", "-", raw)[:64].lstrip("_.@+-")
    return name or "admin"


def sso_user(session: Session, *, issuer: str, subject: str, name_hint: str | None,
             email: str | None, groups: Iterable[str] = (),
             admin_groups: Iterable[str] = (),
             group_roles: Mapping[str, Iterable[tuple[str, str]]] | None = None) -> User:
    """The user a single sign-on login stands for, made on its first login.

    Found by (issuer, subject); a new one is named from ``name_hint`` (the provider's
    preferred_username, else the email's local part), made unique with a number. Its
    admin flag follows the ``admin_groups`` at every login (a user taken out of the group
    is no admin at the next one); ``group_roles`` maps a group to (workspace, role) pairs
    granted to its members (at least that role: a higher one they hold stays). A disabled
    user stays disabled: the caller refuses the login (AuthError)."""
    from batchyard.server.services import roles as role_service

    user = session.scalar(select(User).where(User.issuer == issuer, User.subject == subject))
    member_of = set(groups)
    admin = bool(member_of & set(admin_groups))
    if user is None:
        user = User(name=_free_name(session, name_hint or (email or "").split("@")[0]),
                    email=email, admin=admin, service=False, issuer=issuer, subject=subject,
                    created_at=now(), created_by="sso")
        session.add(user)
        session.flush()
    else:
        user.email = email or user.email
        user.admin = admin or (user.admin and not admin_groups)
    for group in sorted(member_of):
        for workspace, role in (group_roles or {}).get(group, ()):
            role_service.grant_at_least(session, workspace, user, role, by="sso")
    cache.changed(session)
    return user


def _free_name(session: Session, hint: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_.@+-]", "-", hint or "user")[:56].lstrip("_.@+-") or "user"
    taken = set(session.scalars(select(User.name).where(User.name.like(f"{base}%"))))
    if base not in taken:
        return base
    number = 2
    while f"{base}-{number}" in taken:
        number += 1
    return f"{base}-{number}"


# --- teams ---------------------------------------------------------------------------------

def find_team(session: Session, name: str) -> Team:
    team = session.scalar(select(Team).where(Team.name == name))
    if team is None:
        raise NotFound(f"team {name!r} not found (`batchyard team list` shows the teams)")
    return team


def create_team(session: Session, name: str) -> dict[str, Any]:
    check_name("team", name)
    if session.scalar(select(Team.id).where(Team.name == name)) is not None:
        raise Conflict(f"team {name!r} already exists")
    team = Team(name=name, created_at=now())
    session.add(team)
    session.flush()
    return {"name": team.name, "members": [], "created_at": team.created_at}


def list_teams(session: Session) -> list[dict[str, Any]]:
    members: dict[int, list[str]] = {}
    shares: dict[int, dict[str, float]] = {}
    for team_id, user, user_shares in session.execute(
            select(TeamMember.team_id, User.name, TeamMember.shares)
            .join(User, User.id == TeamMember.user_id)):
        members.setdefault(team_id, []).append(user)
        shares.setdefault(team_id, {})[user] = user_shares
    return [{"name": t.name, "members": sorted(members.get(t.id, [])),
             "created_at": t.created_at, "shares": t.shares,
             "member_shares": dict(sorted(shares.get(t.id, {}).items()))}
            for t in session.scalars(select(Team).order_by(Team.name))]


def set_shares(session: Session, team_name: str, shares: float,
               user_name: str | None = None) -> dict[str, Any]:
    """The team's shares under fair share, or (``user_name``) a member's inside it."""
    if shares < 0:
        raise SpecError("shares: must be 0 or more")
    team = session.scalar(select(Team).where(Team.name == team_name))
    if team is None:
        raise SpecError(f"team: no team {team_name!r} (`batchyard team list` shows them)")
    if user_name is None:
        team.shares = shares
    else:
        user = find_user(session, user_name)
        member = session.get(TeamMember, (team.id, user.id))
        if member is None:
            raise SpecError(f"user: {user_name!r} is not in team {team_name!r} (`batchyard "
                            f"team add {team_name} {user_name}` first)")
        member.shares = shares
    session.flush()
    return next(t for t in list_teams(session) if t["name"] == team.name)


def add_member(session: Session, team_name: str, user_name: str) -> dict[str, Any]:
    team = find_team(session, team_name)
    user = find_user(session, user_name)
    if session.get(TeamMember, (team.id, user.id)) is None:
        session.add(TeamMember(team_id=team.id, user_id=user.id))
        session.flush()
        cache.changed(session)
    return next(t for t in list_teams(session) if t["name"] == team.name)


def delete_team(session: Session, team_name: str) -> dict[str, Any]:
    """The team, its memberships, roles, budget and guarantees go; its jobs keep its name
    (the usage report keeps its history)."""
    team = find_team(session, team_name)
    for table in (TeamMember, RoleAssignment, Budget, Guarantee):  # as ON DELETE CASCADE,
        session.execute(delete(table).where(table.team_id == team.id))  # on any database
    session.delete(team)
    session.flush()
    cache.changed(session)
    return {"name": team_name, "deleted": True}


def remove_member(session: Session, team_name: str, user_name: str) -> dict[str, Any]:
    team = find_team(session, team_name)
    user = find_user(session, user_name)
    session.execute(delete(TeamMember).where(TeamMember.team_id == team.id,
                                             TeamMember.user_id == user.id))
    cache.changed(session)
    return next(t for t in list_teams(session) if t["name"] == team.name)


def _teams_by_user(session: Session, user_id: int | None = None) -> dict[int, list[str]]:
    query = select(TeamMember.user_id, Team.name).join(Team, Team.id == TeamMember.team_id)
    if user_id is not None:
        query = query.where(TeamMember.user_id == user_id)
    found: dict[int, list[str]] = {}
    for uid, team in session.execute(query):
        found.setdefault(uid, []).append(team)
    return found


def active_token_count(session: Session, user_id: int) -> int:
    return len(list(session.scalars(select(ApiToken.id).where(
        ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None)))))
