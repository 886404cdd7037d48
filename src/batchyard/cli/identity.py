"""`batchyard user`, `batchyard team` and `batchyard role`."""

from __future__ import annotations

from typing import Any

import typer

from batchyard.cli import groups
from batchyard.cli.common import (
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    emit,
    fail,
    handled,
    human_time,
    table,
    ws_name,
)

user_app = groups.user
team_app = groups.team
role_app = groups.role
ROLES = ("reader", "contributor", "owner")

USER_COLUMNS = [("name", "Name"), ("kind", "Kind"), ("email", "Email", "id?"),
                ("state", "State"), ("teams", "Teams", "id?"), ("created", "Created", "id?")]


def _user_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "kind": ("service" if r.get("service") else "user")
             + (", admin" if r.get("admin") else ""),
             "state": "disabled" if r.get("disabled") else "active",
             "teams": ", ".join(r.get("teams") or []), "created": human_time(r.get("created_at"))}
            for r in rows]


def _say(text: str) -> None:
    console.print(text, highlight=False, markup=False)


@user_app.command("create")
def user_create(name: str = typer.Argument(..., metavar="NAME", help="The user's name."),
                email: str = typer.Option(None, "--email", help="Their email address."),
                admin: bool = typer.Option(False, "--admin", help="A server admin: may do "
                                           "everything everywhere."),
                service: bool = typer.Option(False, "--service", help="A service account "
                                             "(for CI): it uses tokens, never signs in "
                                             "interactively."),
                output: Output = OutputOpt) -> None:
    """Create a user or a service account (admins). Give them a token with `batchyard token
    create --user NAME`, and a role with `batchyard role assign`."""
    with handled():
        data = client().post("/users", {"name": name, "email": email, "admin": admin,
                                        "service": service})
        emit(data, output, lambda d: _say(
            f"{'service account' if d['service'] else 'user'} {d['name']} created"
            f"{' (admin)' if d['admin'] else ''}"))


@user_app.command("list")
def user_list(output: Output = OutputOpt) -> None:
    """List users and service accounts (admins)."""
    with handled():
        emit(client().get("/users"), output,
             lambda d: table(_user_rows(d), USER_COLUMNS, empty="no users"))


@user_app.command("disable")
def user_disable(name: str = typer.Argument(..., metavar="NAME", help="The user's name."),
                 output: Output = OutputOpt) -> None:
    """Disable a user (admins): their tokens and portal sessions stop working at once;
    nothing of theirs is deleted."""
    with handled():
        data = client().post(f"/users/{name}/disable")
        emit(data, output, lambda d: _say(f"user {d['name']} disabled"))


@user_app.command("enable")
def user_enable(name: str = typer.Argument(..., metavar="NAME", help="The user's name."),
                output: Output = OutputOpt) -> None:
    """Enable a disabled user again (admins)."""
    with handled():
        data = client().post(f"/users/{name}/enable")
        emit(data, output, lambda d: _say(f"user {d['name']} enabled"))


# --- teams ------------------------------------------------------------------------------------

def _team_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def member(name: str, shares: dict[str, float]) -> str:
        value = shares.get(name, 1.0)
        return name if value == 1 else f"{name} ({value:g} shares)"

    return [{**r, "shares": f"{r.get('shares', 1.0):g}",
             "members": ", ".join(member(m, r.get("member_shares") or {})
                                  for m in r.get("members") or []) or "-"} for r in rows]


TEAM_COLUMNS = [("name", "Team"), ("shares", "Shares"), ("members", "Members", "text")]


@team_app.command("create")
def team_create(team: str = typer.Argument(..., metavar="TEAM", help="The team's name."),
                output: Output = OutputOpt) -> None:
    """Create a team (admins)."""
    with handled():
        data = client().post("/teams", {"name": team})
        emit(data, output, lambda d: _say(f"team {d['name']} created"))


@team_app.command("set")
def team_set(team: str = typer.Argument(..., metavar="TEAM", help="The team's name."),
             shares: float = typer.Option(..., "--shares", min=0.0,
                                          help="Its shares under fair share (default 1), "
                                          "against the other teams'; with --user, that "
                                          "member's against the team's other members'."),
             user: str = typer.Option(None, "--user", "-u", help="A member of the team."),
             output: Output = OutputOpt) -> None:
    """Set a team's fair-share shares, or a member's inside it (admins). Within a priority
    class, queued jobs go in fair-share order: usage decayed by the server's
    --fairshare-half-life, against the shares."""
    with handled():
        data = client().request("PATCH", f"/teams/{team}", json={"shares": shares, "user": user})
        who = f"{user} in team {data['name']}" if user else f"team {data['name']}"
        emit(data, output, lambda d: _say(f"{who} has {shares:g} shares"))


@team_app.command("add")
def team_add(team: str = typer.Argument(..., metavar="TEAM", help="The team's name."),
             user: str = typer.Argument(..., metavar="USER", help="The user to add."),
             output: Output = OutputOpt) -> None:
    """Add a user to a team (admins): they get the team's roles."""
    with handled():
        data = client().post(f"/teams/{team}/members", {"user": user})
        emit(data, output, lambda d: _say(f"{user} is in team {d['name']} "
                                          f"({', '.join(d['members'])})"))


@team_app.command("remove")
def team_remove(team: str = typer.Argument(..., metavar="TEAM", help="The team's name."),
                user: str = typer.Argument(..., metavar="USER", help="The user to remove."),
                output: Output = OutputOpt) -> None:
    """Take a user out of a team (admins)."""
    with handled():
        data = client().delete(f"/teams/{team}/members/{user}")
        emit(data, output, lambda d: _say(f"{user} left team {d['name']}"))


@team_app.command("delete")
def team_delete(team: str = typer.Argument(..., metavar="TEAM", help="The team's name."),
                output: Output = OutputOpt) -> None:
    """Remove a team (admins): its members, roles, budget and guarantees go with it; its
    jobs keep its name, so the usage report keeps its history."""
    with handled():
        data = client().delete(f"/teams/{team}")
        emit(data, output, lambda d: _say(f"team {d['name']} deleted"))


@team_app.command("list")
def team_list(output: Output = OutputOpt) -> None:
    """List teams and their members."""
    with handled():
        emit(client().get("/teams"), output,
             lambda d: table(_team_rows(d), TEAM_COLUMNS, empty="no teams"))


# --- roles ------------------------------------------------------------------------------------

UserOpt = typer.Option(None, "--user", "-u", help="The user.")
TeamOpt = typer.Option(None, "--team", "-t", help="Or the team.")
ROLE_COLUMNS = [("holder", "User or team"), ("role", "Role"), ("created_by", "Given by", "id?"),
                ("given", "Given", "id?")]


def _holder(user: str | None, team: str | None) -> dict[str, str]:
    if bool(user) == bool(team):
        fail("give --user USER or --team TEAM (one of them)")
    return {"user": user} if user else {"team": team or ""}


@role_app.command("assign")
def role_assign(workspace: str = WorkspaceOpt, user: str = UserOpt, team: str = TeamOpt,
                role: str = typer.Option(..., "--role", "-r", help="reader, contributor or "
                                         "owner."),
                output: Output = OutputOpt) -> None:
    """Give a user or a team a role in a workspace (its owners, admins); it replaces the
    role they had there."""
    with handled():
        if role.strip().lower() not in ROLES:
            fail(f"--role {role!r}: one of {', '.join(ROLES)}")
        data = client().post(f"/workspaces/{ws_name(workspace)}/roles",
                             {**_holder(user, team), "role": role.strip().lower()})
        emit(data, output, lambda d: _say(
            f"{'user ' + d['user'] if d.get('user') else 'team ' + str(d.get('team'))} is "
            f"{d['role']} in workspace {d['workspace']}"))


@role_app.command("list")
def role_list(workspace: str = WorkspaceOpt, output: Output = OutputOpt) -> None:
    """List the role assignments of a workspace."""
    with handled():
        rows = client().get(f"/workspaces/{ws_name(workspace)}/roles")
        emit(rows, output, lambda d: table(
            [{**r, "holder": f"user {r['user']}" if r.get("user") else f"team {r['team']}",
              "given": human_time(r.get("created_at"))} for r in d], ROLE_COLUMNS,
            empty=f"no role assignments in workspace {ws_name(workspace)}"))


@role_app.command("remove")
def role_remove(workspace: str = WorkspaceOpt, user: str = UserOpt, team: str = TeamOpt,
                output: Output = OutputOpt) -> None:
    """Take a user's or a team's role in a workspace away (its owners, admins). The last
    owner cannot be removed."""
    with handled():
        data = client().delete_with(f"/workspaces/{ws_name(workspace)}/roles",
                                    **_holder(user, team))
        emit(data, output, lambda d: _say(
            f"{'user ' + d['user'] if d.get('user') else 'team ' + str(d.get('team'))} no "
            f"longer has a role in workspace {d['workspace']}"))
