"""`batchyard login|logout|whoami` and `batchyard token create|list|revoke`. Signing in
itself (which flow, storing the credential) is client.signin's."""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from batchyard import errors
from batchyard.cli import groups
from batchyard.cli.common import (
    Output,
    OutputOpt,
    client,
    console,
    emit,
    err_console,
    fail,
    handled,
    human_time,
    key_values,
    table,
)

token_app = groups.token
ServerOpt = typer.Option(None, "--server", "-s", help="The server's URL, e.g. "
                         "https://10.0.0.5:8742.")


def _ask(question: str) -> str:
    """A secret typed at the prompt (hidden), or the first line of stdin."""
    if sys.stdin is None or not sys.stdin.isatty():
        return sys.stdin.readline().strip() if sys.stdin is not None else ""
    return str(typer.prompt(question, hide_input=True)).strip()


def login(server: str = typer.Option(..., "--server", "-s", help="The server's URL, e.g. "
                                     "https://10.0.0.5:8742."),
          with_token: bool = typer.Option(False, "--with-token", help="Read the personal "
                                          "token from stdin."),
          output: Output = OutputOpt) -> None:
    # help: groups.COMMAND_HELP["login"]
    with handled():
        from batchyard.client import signin

        token = sys.stdin.readline().strip() if with_token else \
            os.environ.get("BATCHYARD_TOKEN", "").strip()
        if with_token and not token:
            fail("--with-token: stdin held no token")
        who = signin.sign_in(server, token or None, _ask)
        emit(who, output, lambda d: console.print(
            f"Logged in to {d['server']} as {d['name']}"
            f"{' (admin)' if d.get('admin') else ''}", highlight=False, markup=False))


def logout(server: str = ServerOpt, output: Output = OutputOpt) -> None:
    # help: groups.COMMAND_HELP["logout"]
    with handled():
        from batchyard.client import credentials
        from batchyard.client.http import Client

        chosen = credentials.normal(server) if server else None
        found = credentials.current() if chosen is None else (
            (chosen, credentials.token_for(chosen) or ""))
        data: dict[str, Any] = {"server": found[0] if found else None, "revoked": False}
        if found and found[1]:
            c = Client(found[0], found[1])
            try:  # a token made for this login ends here; a personal one stays valid
                data["revoked"] = bool(c.post("/auth/logout").get("revoked"))
            except errors.BatchyardError:
                pass  # the server is away, or the token already refused: forget it anyway
            finally:
                c.close()
        data["forgotten"] = credentials.forget(chosen) is not None
        emit(data, output, lambda d: console.print(
            f"Logged out of {d['server']}" if d["forgotten"] else "not logged in"
            + (f" to {chosen}" if chosen else ""), highlight=False, markup=False))


def whoami(output: Output = OutputOpt) -> None:
    # help: groups.COMMAND_HELP["whoami"]
    with handled():
        c = client()
        data = c.get("/auth/me")
        data["server"] = c.url
        emit(data, output, _render_me)


def _render_me(d: dict[str, Any]) -> None:
    kind = "service account" if d.get("service") else "user"
    key_values({**d, "kind": kind + (", admin" if d.get("admin") else ""),
                "teams": ", ".join(d.get("teams") or []) or None},
               [("name", "User"), ("kind", "Kind"), ("email", "Email"), ("server", "Server"),
                ("credential", "Signed in with"), ("teams", "Teams")])
    if d.get("roles"):
        table(d["roles"], [("workspace", "Workspace"), ("role", "Role"), ("via", "Via")],
              title="Roles")
    elif not d.get("admin"):
        err_console.print("no role in any workspace yet: ask a workspace's owner or an admin",
                          highlight=False)


# --- tokens -----------------------------------------------------------------------------------

TOKEN_COLUMNS = [("id", "Id", "num"), ("name", "Name"), ("user", "User"), ("prefix", "Token"),
                 ("state", "State"), ("created", "Created", "id?"), ("expires", "Expires")]


def _token_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "created": human_time(r.get("created_at")),
             "expires": human_time(r["expires_at"]) if r.get("expires_at") else "never"}
            for r in rows]


@token_app.command("create")
def token_create(name: str = typer.Option(None, "--name", "-n", help="A name to tell it "
                                          "apart (default: made from the time)."),
                 expires: str = typer.Option(None, "--expires", help="How long it lives: "
                                             "30d, 12h, 90m, seconds, or 'never' (default)."),
                 user: str = typer.Option(None, "--user", "-u", help="Make it for this user "
                                          "or service account (admins)."),
                 output: Output = OutputOpt) -> None:
    """Make a personal token; it is printed once, here: store it now."""
    with handled():
        body = {"name": name, "expires": expires}
        path = f"/users/{user}/tokens" if user else "/tokens"
        data = client().post(path, body)
        emit(data, output, _render_new_token)


def _render_new_token(d: dict[str, Any]) -> None:
    print(d["token"])
    until = human_time(d["expires_at"]) if d.get("expires_at") else "never expires"
    err_console.print(f"token {d['id']} ({d['name']}) of {d['user']}, {until}: it is shown "
                      "only now; use it as BATCHYARD_TOKEN or with `batchyard login`",
                      highlight=False, markup=False, soft_wrap=True)


@token_app.command("list")
def token_list(user: str = typer.Option(None, "--user", "-u", help="The tokens of this user "
                                        "(admins)."),
               every: bool = typer.Option(False, "--all", help="Everyone's tokens (admins)."),
               output: Output = OutputOpt) -> None:
    """List tokens (your own unless --user/--all): never the tokens themselves."""
    with handled():
        c = client()
        rows = c.get(f"/users/{user}/tokens") if user else c.get("/tokens", all=every or None)
        emit(rows, output, lambda d: table(_token_rows(d), TOKEN_COLUMNS, empty="no tokens"))


@token_app.command("revoke")
def token_revoke(token_id: str = typer.Argument(..., metavar="ID",
                                                help="The token's id (`token list`)."),
                 output: Output = OutputOpt) -> None:
    """Revoke a token: it stops working at once, everywhere."""
    with handled():
        if not token_id.isdigit():
            fail(f"ID {token_id!r}: a token's id is a number (`batchyard token list`)")
        data = client().delete(f"/tokens/{int(token_id)}")
        emit(data, output, lambda d: console.print(f"token {d['id']} ({d['name']}) of "
                                                   f"{d['user']} revoked", highlight=False,
                                                   markup=False))
