"""`batchyard agent`: join this machine to a cluster and run its share of jobs."""

from __future__ import annotations

from pathlib import Path

import typer

from batchyard.cli.common import fail


def agent(
    server: str = typer.Option(..., "--server", help="The server's URL, e.g. "
                               "https://10.0.0.5:8742."),
    join_token: str = typer.Option(None, "--join-token", envvar="BATCHYARD_JOIN_TOKEN",
                                   help="From `batchyard cluster join-command` (needed at the "
                                   "first start only)."),
    ca_sha256: str = typer.Option(None, "--ca-sha256", help="sha256 of the server's CA: "
                                  "pins it (printed by join-command)."),
    ca_file: Path = typer.Option(None, "--ca-file", help="Trust this CA file instead."),
    name: str = typer.Option(None, "--name", help="Node name (default: the hostname)."),
    work_dir: Path = typer.Option(Path("/var/lib/batchyard-agent"), "--work-dir",
                                  help="Where jobs' directories, tickets and state live."),
    cpus: int = typer.Option(None, "--cpus", min=1, help="Offer at most this many CPUs."),
    gpus: int = typer.Option(None, "--gpus", min=0, help="Offer at most this many GPUs."),
    memory: float = typer.Option(None, "--memory", min=0.1, help="Offer at most this many "
                                 "GB of memory."),
) -> None:
    # help: groups.COMMAND_HELP["agent"] (root help lists it without importing this module)
    from batchyard.agent.daemon import AgentConfig, main

    if not server.startswith(("http://", "https://")):
        fail("--server: a URL like https://HOST:PORT")
    if ca_file is not None and not ca_file.is_file():
        fail(f"--ca-file {ca_file}: no such file")
    cfg = AgentConfig(server=server, join_token=join_token, work_dir=work_dir.absolute(),
                      ca_sha256=ca_sha256, ca_file=str(ca_file) if ca_file else None,
                      name=name, cpus=cpus, gpus=gpus, memory=memory)
    raise typer.Exit(main(cfg))
