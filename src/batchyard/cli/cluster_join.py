"""`batchyard cluster join-command` and `cluster join-token list|revoke`: how machines you own
join a `--backend machines` cluster."""

from __future__ import annotations

import shlex
from typing import Any

import typer

from batchyard.cli.cluster import app
from batchyard.cli.common import (
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    emit,
    handled,
    human_time,
    name_arg,
    pick_name,
    table,
    ws_name,
)

token_app = typer.Typer(help="Join tokens of a machines cluster.", no_args_is_help=True)
app.add_typer(token_app, name="join-token")


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise typer.BadParameter(f"{text!r}: a duration like 3600, 30m, 24h or 7d",
                                 param_hint="--ttl") from None


@app.command("join-command")
def join_command(
    name_arg_: str = name_arg("cluster"),
    name: str = typer.Option(None, "--name", "-n", help="A cluster created with --backend "
                             "machines (or give it as NAME)."),
    workspace: str = WorkspaceOpt,
    ttl: str = typer.Option("24h", "--ttl", help="How long the join token stays valid."),
    server: str = typer.Option(None, "--server", help="The server's URL as the machines "
                               "reach it (default: the address the server is bound to)."),
    output: Output = OutputOpt,
) -> None:
    """Print the line to run on each machine to join it to the cluster (a fresh join token,
    shown only here; only its hash is kept)."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        data = client().post(f"/workspaces/{ws_name(workspace)}/clusters/{name}/join-tokens",
                             {"ttl": _duration(ttl)})
        url = server or data["server"]
        argv = ["batchyard", "agent", "--server", url, "--join-token", data["token"]]
        if data.get("ca_sha256") and url.startswith("https:"):
            argv += ["--ca-sha256", data["ca_sha256"]]
        data["command"] = shlex.join(argv)
        if url.split("//", 1)[-1].startswith(("127.", "localhost", "[::1]")):
            data["warning"] = ("the server listens on loopback only: other machines cannot "
                               "reach it; restart it with `batchyard server start --host "
                               "ADDR` (HTTPS) or pass --server")
        emit(data, output, _render)


def _render(data: dict[str, Any]) -> None:
    console.print(f"# run on each machine to join cluster {data['cluster']} "
                  f"(token {data['prefix']}…, valid until {_when(data['expires_at'])}):")
    console.print(data["command"], markup=False, highlight=False, soft_wrap=True)
    if data.get("warning"):
        console.print(f"[yellow]warning:[/yellow] {data['warning']}")


def _when(stamp: float) -> str:
    return human_time(stamp)


@token_app.command("list")
def token_list(name_arg_: str = name_arg("cluster"),
               name: str = typer.Option(None, "--name", "-n", help="The cluster's name (or "
                                        "give it as NAME)."),
               workspace: str = WorkspaceOpt, output: Output = OutputOpt) -> None:
    """Join tokens of the cluster (by prefix; the tokens themselves are never shown again)."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        rows = client().get(f"/workspaces/{ws_name(workspace)}/clusters/{name}/join-tokens")
        emit(rows, output, lambda d: table(
            [{**r, "created": human_time(r.get("created_at")),
              "expires": human_time(r.get("expires_at"))} for r in d],
            [("prefix", "Prefix"), ("created", "Created"), ("expires", "Expires"),
             ("revoked", "Revoked"), ("expired", "Expired")],
            empty=f"no join tokens for cluster {name}"))


@token_app.command("revoke")
def token_revoke(name_arg_: str = name_arg("cluster"),
                 name: str = typer.Option(None, "--name", "-n", help="The cluster's name (or "
                                          "give it as NAME)."),
                 workspace: str = WorkspaceOpt,
                 prefix: str = typer.Option(None, "--prefix", help="Revoke one token (its "
                                            "prefix or the token); default: all of them."),
                 output: Output = OutputOpt) -> None:
    """Revoke join tokens: no new machine can join with them (joined ones stay)."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        data = client().delete_with(f"/workspaces/{ws_name(workspace)}/clusters/{name}"
                                    "/join-tokens", prefix=prefix)
        emit(data, output, lambda d: console.print(f"revoked {d['revoked']} join token(s)"))
