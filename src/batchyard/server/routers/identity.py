"""Users, service accounts, teams, role assignments and the audit trail."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server.routers.deps import CommitRoute, session
from batchyard.server.security.permissions import Admin, InWorkspace, SignedIn
from batchyard.server.security.principal import Principal, Role
from batchyard.server.services import audit, identities, roles, tokens

router = APIRouter(tags=["identity"], route_class=CommitRoute)
USER = "/users/{user}"
TEAM = "/teams/{team}"


class UserIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    email: str | None = Field(None, max_length=255, pattern=r"^[^\x00\s]+@[^\x00\s]+$")
    admin: bool = False
    service: bool = Field(False, description="A service account (for CI): it signs in only "
                          "with its tokens, never interactively.")


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, max_length=64)
    expires: str | float | None = Field(None, description="How long it lives: a duration "
                                        "('30d', '12h', seconds) or 'never' (default).")


class TeamIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)


class TeamSetIn(BaseModel):
    """Fair-share shares of a team, or of one of its members inside it (``user``)."""

    model_config = ConfigDict(extra="forbid")
    shares: float = Field(..., ge=0, le=1e6, description="Shares under fair share (0 or more).")
    user: str | None = Field(None, max_length=64, description="A member of the team: "
                             "their shares inside it.")


class MemberIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(min_length=1, max_length=64)


class RoleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str | None = Field(None, max_length=64)
    team: str | None = Field(None, max_length=64)
    role: str = Field(min_length=1, max_length=16, description="reader, contributor or owner")


# --- users ---------------------------------------------------------------------------------

@router.post("/users", status_code=201)
def create_user(body: UserIn, s: Session = Depends(session),
                who: Principal = Depends(Admin("user.create",
                                               target=lambda p, b: b.get("name")))
                ) -> dict[str, Any]:
    return identities.create_user(s, body.name, email=body.email, admin=body.admin,
                                  service=body.service, by=who.name)


@router.get("/users", dependencies=[Depends(Admin())])
def list_users(s: Session = Depends(session)) -> list[dict[str, Any]]:
    return identities.list_users(s)


@router.get(USER, dependencies=[Depends(Admin())])
def show_user(user: str, s: Session = Depends(session)) -> dict[str, Any]:
    return identities.show_user(s, user)


@router.post(USER + "/disable", dependencies=[Depends(Admin("user.disable"))])
def disable_user(user: str, s: Session = Depends(session)) -> dict[str, Any]:
    """Every token and portal session of the user stops working at once."""
    return identities.set_disabled(s, user, True)


@router.post(USER + "/enable", dependencies=[Depends(Admin("user.enable"))])
def enable_user(user: str, s: Session = Depends(session)) -> dict[str, Any]:
    return identities.set_disabled(s, user, False)


@router.post(USER + "/tokens", status_code=201)
def create_token_for(user: str, body: TokenIn, s: Session = Depends(session),
                     who: Principal = Depends(Admin("token.create"))) -> dict[str, Any]:
    """A token of any user or service account, made by an admin (servers without single
    sign-on hand tokens out this way). Shown once."""
    return tokens.issue(s, identities.find_user(s, user), name=body.name,
                        expires=body.expires, by=who.name)


@router.get(USER + "/tokens", dependencies=[Depends(Admin())])
def list_tokens_of(user: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return tokens.list_tokens(s, identities.find_user(s, user).id)


# --- teams ---------------------------------------------------------------------------------

@router.post("/teams", status_code=201,
             dependencies=[Depends(Admin("team.create", target=lambda p, b: b.get("name")))])
def create_team(body: TeamIn, s: Session = Depends(session)) -> dict[str, Any]:
    return identities.create_team(s, body.name)


@router.get("/teams", dependencies=[Depends(SignedIn())])
def list_teams(s: Session = Depends(session)) -> list[dict[str, Any]]:
    return identities.list_teams(s)


@router.patch(TEAM, dependencies=[Depends(Admin(
    "team.set", target=lambda p, b: p.get("team")))])
def set_team(team: str, body: TeamSetIn, s: Session = Depends(session)) -> dict[str, Any]:
    return identities.set_shares(s, team, body.shares, body.user)


@router.post(TEAM + "/members", dependencies=[Depends(Admin(
    "team.add", target=lambda p, b: f"{p.get('team')}/{b.get('user')}"))])
def add_member(team: str, body: MemberIn, s: Session = Depends(session)) -> dict[str, Any]:
    return identities.add_member(s, team, body.user)


@router.delete(TEAM, dependencies=[Depends(Admin("team.delete"))])
def delete_team(team: str, s: Session = Depends(session)) -> dict[str, Any]:
    return identities.delete_team(s, team)


@router.delete(TEAM + "/members/{user}", dependencies=[Depends(Admin("team.remove"))])
def remove_member(team: str, user: str, s: Session = Depends(session)) -> dict[str, Any]:
    return identities.remove_member(s, team, user)


# --- roles ---------------------------------------------------------------------------------

def _holder(params: dict[str, Any], body: dict[str, Any]) -> str:
    holder = f"user:{body.get('user')}" if body.get("user") else f"team:{body.get('team')}"
    return f"{holder} {body.get('role', '')}".strip()


@router.get("/workspaces/{ws}/roles", dependencies=[Depends(InWorkspace(Role.reader))])
def list_roles(ws: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return roles.list_assignments(s, ws)


@router.post("/workspaces/{ws}/roles")
def assign_role(ws: str, body: RoleIn, s: Session = Depends(session),
                who: Principal = Depends(InWorkspace(Role.owner, "role.assign",
                                                     target=_holder))) -> dict[str, Any]:
    return roles.assign(s, ws, user=body.user, team=body.team, role=body.role, by=who.name)


@router.delete("/workspaces/{ws}/roles", dependencies=[Depends(InWorkspace(Role.owner,
                                                                           "role.remove"))])
def remove_role(ws: str, user: str | None = Query(None, max_length=64),
                team: str | None = Query(None, max_length=64),
                s: Session = Depends(session)) -> dict[str, Any]:
    """The last owner of a workspace cannot be removed (409)."""
    return roles.remove(s, ws, user=user, team=team)


# --- the audit trail -----------------------------------------------------------------------

SINCE = Query(None, max_length=64, description="A duration back from now ('1d'), a date "
              "('2025-01-31') or epoch seconds.")
LIMIT = Query(1000, ge=1, le=audit.MAX_PAGE, description="The newest this many entries.")


@router.get("/audit", dependencies=[Depends(Admin())])
def audit_list(user: str | None = Query(None, max_length=64), since: str | None = SINCE,
               workspace: str | None = Query(None, max_length=64),
               action: str | None = Query(None, max_length=48), limit: int = LIMIT,
               s: Session = Depends(session)) -> list[dict[str, Any]]:
    """Every entry (server admins), oldest first."""
    return audit.list_entries(s, user=user, since=since, workspace=workspace, action=action,
                              limit=limit)


@router.get("/workspaces/{ws}/audit", dependencies=[Depends(InWorkspace(Role.owner))])
def workspace_audit(ws: str, user: str | None = Query(None, max_length=64),
                    since: str | None = SINCE, action: str | None = Query(None, max_length=48),
                    limit: int = LIMIT, s: Session = Depends(session)) -> list[dict[str, Any]]:
    """The entries of one workspace (its owners), oldest first."""
    return audit.list_entries(s, user=user, since=since, workspace=ws, action=action,
                              limit=limit)
