"""`batchyard server start|stop|status`."""

from __future__ import annotations

import typer

from batchyard.cli.common import Output, OutputOpt, console, emit, handled, key_values

app = typer.Typer(help="Run the batchyard server (API + scheduler) in the background.",
                  no_args_is_help=True)


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
    output: Output = OutputOpt,
) -> None:
    """Start the server (detached unless --foreground). Off loopback it serves HTTPS with a CA
    of its own ($BATCHYARD_HOME/tls/ca.pem): give clients elsewhere that file (BATCHYARD_CA)
    or its sha256 (BATCHYARD_CA_SHA256, printed in the server log)."""
    with handled():
        from batchyard.client import local_server  # httpx, ssl: only where needed
        from batchyard.config import home, read_server_info, read_token

        info = read_server_info()
        if info and local_server.pid_alive(info.pid) and local_server.healthy(info.url,
                                                                             read_token()):
            emit({"url": info.url, "pid": info.pid, "already_running": True}, output,
                 lambda d: console.print(f"already running at {d['url']} (pid {d['pid']})"))
            return
        from batchyard.server.main import decide_tls

        decide_tls(host, tls_cert, tls_key, force_tls, insecure_http)  # bad flags: say so here
        if foreground:
            from batchyard.server.main import preferred_port, serve

            chosen, explicit = (port, True) if port is not None else preferred_port()
            raise typer.Exit(serve(host, chosen, tls_cert=tls_cert, tls_key=tls_key,
                                   force_tls=force_tls, insecure_http=insecure_http,
                                   port_explicit=explicit))
        info = local_server.start(host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
                                  insecure_http=insecure_http, force_tls=force_tls)
        emit({"url": info.url, "pid": info.pid, "home": str(home())}, output,
             lambda d: console.print(f"batchyard server running at {d['url']} "
                                     f"(pid {d['pid']}, home {d['home']})"))


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
        from batchyard.config import home, read_server_info, read_token

        info = read_server_info()
        health = local_server.healthy(info.url, read_token()) if info else None
        data = {"running": bool(health), "url": info.url if info else None,
                "pid": info.pid if info else None, "home": str(home()),
                "version": health.get("version") if health else None}
        emit(data, output, lambda d: key_values(d, ["running", "url", "pid", "home",
                                                    "version"]))
        if not health:
            raise typer.Exit(1)


