"""`batchyard server start|stop|status`."""

from __future__ import annotations

import typer

from batchyard.cli.common import Output, OutputOpt, console, emit, handled, key_values
from batchyard.client import local_server
from batchyard.config import home, read_server_info, read_token

app = typer.Typer(help="Run the batchyard server (API + scheduler) in the background.",
                  no_args_is_help=True)


@app.command()
def start(
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback unless told."),
    port: int = typer.Option(None, help="Port (default 8742, or any free one)."),
    foreground: bool = typer.Option(False, "--foreground", help="Run in this terminal."),
    output: Output = OutputOpt,
) -> None:
    """Start the server (detached unless --foreground)."""
    with handled():
        info = read_server_info()
        if info and local_server.pid_alive(info.pid) and local_server.healthy(info.url,
                                                                             read_token()):
            emit({"url": info.url, "pid": info.pid, "already_running": True}, output,
                 lambda d: console.print(f"already running at {d['url']} (pid {d['pid']})"))
            return
        if foreground:
            from batchyard.server.main import serve

            raise typer.Exit(serve(host, port if port is not None else 8742))
        info = local_server.start(host=host, port=port)
        emit({"url": info.url, "pid": info.pid, "home": str(home())}, output,
             lambda d: console.print(f"batchyard server running at {d['url']} "
                                     f"(pid {d['pid']}, home {d['home']})"))


@app.command()
def stop(output: Output = OutputOpt) -> None:
    """Stop the server. Running jobs keep running and are picked up at the next start."""
    with handled():
        stopped = local_server.stop()
        emit({"stopped": stopped}, output,
             lambda d: console.print("stopped" if d["stopped"] else "no server was running"))


@app.command()
def status(output: Output = OutputOpt) -> None:
    """Whether a server runs, where, and its version."""
    with handled():
        info = read_server_info()
        health = local_server.healthy(info.url, read_token()) if info else None
        data = {"running": bool(health), "url": info.url if info else None,
                "pid": info.pid if info else None, "home": str(home()),
                "version": health.get("version") if health else None}
        emit(data, output, lambda d: key_values(d, ["running", "url", "pid", "home",
                                                    "version"]))
        if not health:
            raise typer.Exit(1)


