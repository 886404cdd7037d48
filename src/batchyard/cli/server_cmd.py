"""`batchyard server start|stop|status|token` and `batchyard portal`."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import typer

from batchyard.cli import complete, groups
from batchyard.cli.common import (
    EXIT_NOT_FOUND,
    ExperimentOpt,
    Output,
    OutputOpt,
    WorkspaceOpt,
    console,
    emit,
    err_console,
    fail,
    handled,
    key_values,
)
from batchyard.errors import SpecError

app = groups.server


@app.command()
def start(
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback unless told. "
                             "Any other address (0.0.0.0 included) serves HTTPS."),
    port: int = typer.Option(None, help="Port (default 8742, or any free one)."),
    foreground: bool = typer.Option(False, "--foreground", help="Run in this terminal."),
    tls_cert: str = typer.Option(None, "--tls-cert", metavar="PATH",
                                 help="Serve HTTPS with this certificate (chain) instead of "
                                 "the home's own CA; needs --tls-key."),
    tls_key: str = typer.Option(None, "--tls-key", metavar="PATH",
                                help="Private key of --tls-cert."),
    insecure_http: bool = typer.Option(False, "--insecure-http",
                                       help="Plain HTTP on a non-loopback address: tokens "
                                       "cross the network in clear."),
    force_tls: bool = typer.Option(False, "--tls", hidden=True,
                                   help="HTTPS with the home's CA even on loopback."),
    workers: str = typer.Option(None, "--workers", envvar="BATCHYARD_WORKERS",
                                help="Server processes behind the port, or 'auto' (one per "
                                "core). More than one needs PostgreSQL (BATCHYARD_DB_URL)."),
    oidc_issuer: str = typer.Option(None, "--oidc-issuer", metavar="URL",
                                    envvar="BATCHYARD_OIDC_ISSUER",
                                    help="Single sign-on: the OpenID provider's issuer URL "
                                    "(https, or http on loopback)."),
    oidc_client_id: str = typer.Option(None, "--oidc-client-id", metavar="ID",
                                       envvar="BATCHYARD_OIDC_CLIENT_ID",
                                       help="This server's client id at the provider."),
    oidc_secret_file: str = typer.Option(None, "--oidc-client-secret-file", metavar="FILE",
                                         envvar="BATCHYARD_OIDC_CLIENT_SECRET_FILE",
                                         help="A file holding the client's secret (none: a "
                                         "public client)."),
    oidc_admin_group: list[str] = typer.Option(None, "--oidc-admin-group", metavar="GROUP",
                                               help="Members of this group (the 'groups' "
                                               "claim) are server admins. Repeatable."),
    oidc_group_role: list[str] = typer.Option(None, "--oidc-group-role",
                                              metavar="GROUP=WORKSPACE:ROLE",
                                              help="Members of GROUP hold at least ROLE "
                                              "(reader, contributor, owner) in WORKSPACE, "
                                              "brought up to date at each sign-in. "
                                              "Repeatable."),
    oidc_login_lifetime: str = typer.Option(None, "--oidc-login-lifetime",
                                            metavar="DURATION",
                                            help="How long a CLI's single sign-on lasts "
                                            "(default 7d)."),
    fairshare_half_life: str = typer.Option(None, "--fairshare-half-life",
                                            metavar="DURATION",
                                            help="How fast past usage is forgotten by the "
                                            "fair-share order: it counts half after this "
                                            "long (default 7d)."),
    output: Output = OutputOpt,
) -> None:
    """Start the server and its web portal (detached unless --foreground).

    Off loopback it serves HTTPS with a CA of its own ($BATCHYARD_HOME/tls/ca.pem): give
    clients elsewhere that file (BATCHYARD_CA) or its sha256 (BATCHYARD_CA_SHA256, printed
    in the server log).

    With --oidc-issuer and --oidc-client-id, people sign in by single sign-on (OpenID
    Connect): `batchyard login --server URL` by the device flow, the portal by the
    provider's page; users are made at their first sign-in. Register URL/login/sso/callback
    as the client's redirect URI for the portal."""
    with handled():
        from batchyard.client import local_server  # httpx, ssl: only where needed
        from batchyard.config import home, home_token, read_server_info, read_token
        from batchyard.server.sso.settings import parse as parse_sso

        oidc = parse_sso(oidc_issuer, oidc_client_id, oidc_secret_file, oidc_admin_group,
                         oidc_group_role, oidc_login_lifetime)
        if fairshare_half_life is not None:
            _half_life(fairshare_half_life)
        info = read_server_info()
        token = home_token() or read_token()  # this home's server: its own token first
        if info and local_server.pid_alive(info.pid) and local_server.healthy(info.url, token):
            if oidc is not None:
                err_console.print("the server already runs: its settings stay as they are "
                                  "(`batchyard server stop` first to start it with "
                                  "--oidc-…)", highlight=False, markup=False)
            emit({"url": info.url, "pid": info.pid, "already_running": True,
                  "portal": portal_url(info.url)}, output,
                 lambda d: console.print(f"already running at {d['url']} (pid {d['pid']})\n"
                                         + _portal_hint(d["url"]), highlight=False))
            return
        from batchyard.server.main import decide_tls

        decide_tls(host, tls_cert, tls_key, force_tls, insecure_http)  # bad flags: say so here
        from batchyard.config import database_url
        from batchyard.server.workers import check_database, parse_count

        count = parse_count(workers)
        check_database(count, urlsplit(database_url()).scheme.split("+")[0])
        if foreground:
            from batchyard.server.main import preferred_port, serve

            chosen, explicit = (port, True) if port is not None else preferred_port()
            raise typer.Exit(serve(host, chosen, tls_cert=tls_cert, tls_key=tls_key,
                                   force_tls=force_tls, insecure_http=insecure_http,
                                   port_explicit=explicit, workers=count, oidc=oidc))
        info = local_server.start(host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
                                  insecure_http=insecure_http, force_tls=force_tls,
                                  workers=count, oidc=oidc)
        emit({"url": info.url, "pid": info.pid, "home": str(home()),
              "portal": portal_url(info.url)}, output,
             lambda d: console.print(f"batchyard server running at {d['url']} "
                                     f"(pid {d['pid']}, home {d['home']})\n"
                                     + _portal_hint(d["url"]), highlight=False))


@app.command()
def stop(output: Output = OutputOpt) -> None:
    """Stop the server. Running jobs keep running and are picked up at the next start."""
    with handled():
        from batchyard.client import local_server

        stopped = local_server.stop()
        emit({"stopped": stopped}, output,
             lambda d: console.print("stopped" if d["stopped"] else "no server was running"))


@app.command()
def status(output: Output = OutputOpt) -> None:
    """Whether a server runs, where, and its version."""
    with handled():
        from batchyard.client import local_server
        from batchyard.config import home, home_token, read_server_info, read_token

        info = read_server_info()
        health = local_server.healthy(info.url, home_token() or read_token()) if info else None
        data = {"running": bool(health), "url": info.url if info else None,
                "pid": info.pid if info else None, "home": str(home()),
                "version": health.get("version") if health else None}
        emit(data, output, lambda d: key_values(d, ["running", "url", "pid", "home",
                                                    "version"]))
        if not health:
            raise typer.Exit(1)




def _half_life(value: str) -> None:
    """Checked here (exit 2 naming the flag); the server process reads it from its
    environment (server.fairshare_book)."""
    import os

    from batchyard.server.fairshare_book import HALF_LIFE_ENV
    from batchyard.spec.durations import parse_duration

    try:
        seconds = parse_duration(value)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"--fairshare-half-life: {exc}") from None
    if seconds <= 0:
        raise SpecError("--fairshare-half-life: must be more than 0")
    os.environ[HALF_LIFE_ENV] = f"{seconds:g}"


def portal_url(server_url: str, path: str = "/") -> str:
    """The portal's sign-in page on ``server_url``, going on to ``path`` once signed in."""
    from urllib.parse import quote

    base = server_url.rstrip("/")
    return f"{base}/login" if path == "/" else f"{base}/login?next={quote(path, safe='/')}"


def _portal_hint(server_url: str) -> str:
    return (f"portal: {server_url.rstrip('/')}/ (sign in with the token `batchyard server "
            "token` prints; `batchyard portal --open` opens it)")


@app.command()
def token(scrape: bool = typer.Option(False, "--scrape", help="The scrape token instead: what "
                                      "Prometheus sends to GET /metrics (made on first use; "
                                      "it reaches nothing else)."),
          output: Output = OutputOpt) -> None:
    """Print the admin token of this home: what the portal's sign-in page asks for.

    It is $BATCHYARD_HOME/token; API clients send it as `Authorization: Bearer TOKEN`.
    --scrape prints $BATCHYARD_HOME/scrape-token, for Prometheus's `authorization`."""
    with handled():
        if scrape:
            from batchyard.scrape_token import ensure, token_file

            emit({"token": ensure(), "path": str(token_file())}, output,
                 lambda d: print(d["token"]))
            return
        from batchyard.config import home, token_path

        path = token_path()
        try:
            value = path.read_text().strip()
        except FileNotFoundError:
            value = ""
        if not value:
            fail(f"no admin token in {home()} yet: it is made when the server first starts "
                 "(`batchyard server start`)", EXIT_NOT_FOUND)
        emit({"token": value, "path": str(path)}, output,
             lambda d: print(d["token"]))


def portal(
    open_: bool = typer.Option(False, "--open", help="Open the portal in a web browser, "
                               "signed in by a one-time link (also printed)."),
    job: str = typer.Option(None, "--job", "-j", help="Link to this job's page.",
                            autocompletion=complete.jobs),
    experiment: str = ExperimentOpt,
    workspace: str = WorkspaceOpt,
    output: Output = OutputOpt,
) -> None:
    # help: groups.COMMAND_HELP["portal"] (root help lists it without importing this module)
    with handled():
        from batchyard.cli.common import client

        c = client()
        page = "/"
        if job:
            from batchyard.cli.job import locate
            from batchyard.sdk.job import portal_path

            path, _ = locate(c, workspace, experiment, job)
            parts = path.split("/")  # /workspaces/WS/experiments/EXP/jobs/NAME
            page = portal_path(parts[2], parts[4], parts[6])
        data: dict[str, Any] = {"url": portal_url(c.url, page), "server": c.url,
                                "token_command": "batchyard server token"}
        if open_:  # signed in by a one-time link (as Jupyter's ?token=), never the token
            import webbrowser

            link = c.post("/portal/sign-in-links", {"next": page})
            data.update(url=c.url + link["path"], one_time=True,
                        expires_in=link["expires_in"])
            data["opened"] = bool(webbrowser.open(data["url"]))
        emit(data, output, _render_portal)


def _render_portal(d: dict[str, Any]) -> None:
    console.print(d["url"], markup=False, highlight=False, soft_wrap=True)
    from batchyard.cli.common import err_console

    if d.get("one_time"):
        text = (f"a one-time sign-in link: it signs in the first browser that opens it, "
                f"within {d['expires_in']:g}s")
        if not d.get("opened"):
            text += " (no browser could be opened here: open the link yourself)"
    else:
        text = ("sign in with the admin token: batchyard server token (or `batchyard portal "
                "--open` signs you in)")
    err_console.print(text, highlight=False, markup=False, soft_wrap=True)
