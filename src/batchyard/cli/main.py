"""Entry point of the `batchyard` command."""

from __future__ import annotations

import json
import sys

import typer

from batchyard import __version__
from batchyard.cli import cluster, job, server_cmd, workspace

app = typer.Typer(
    name="batchyard",
    help="Clusters and distributed training jobs on machines you own "
    "(the az batchai / AML Compute workflow, self-hosted).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(server_cmd.app, name="server")
app.add_typer(workspace.workspace_app, name="workspace")
app.add_typer(cluster.app, name="cluster")
app.add_typer(workspace.experiment_app, name="experiment")
app.add_typer(job.app, name="job")
schema_app = typer.Typer(help="JSON Schemas of the file formats.", no_args_is_help=True)
app.add_typer(schema_app, name="schema")


@schema_app.command("job")
def schema_job() -> None:
    """Print the JSON Schema of the native job YAML."""
    from batchyard.spec.job import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@app.command("version")
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
