"""Entry point of the `batchyard` command."""

from __future__ import annotations

import json
import sys

import typer

from batchyard import __version__
from batchyard.cli import cluster, cluster_join, common, datastore, job, server_cmd, workspace
from batchyard.cli.agent import agent

app = typer.Typer(
    name="batchyard",
    help="Clusters and distributed training jobs on machines you own "
    "(the az batchai / AML Compute workflow, self-hosted).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _global(
    ca_file: str = typer.Option(None, "--ca-file", envvar="BATCHYARD_CA",
                                help="Trust the server's HTTPS with this CA file."),
    ca_sha256: str = typer.Option(None, "--ca-sha256", envvar="BATCHYARD_CA_SHA256",
                                  help="Or pin the server's CA by its sha256."),
) -> None:
    """Clusters and distributed training jobs on machines you own."""
    import os

    if ca_file:
        os.environ["BATCHYARD_CA"] = ca_file
    if ca_sha256:
        os.environ["BATCHYARD_CA_SHA256"] = ca_sha256


app.add_typer(server_cmd.app, name="server")
app.command("agent")(agent)
assert cluster_join.token_app  # registers `cluster join-command` and `cluster join-token`
app.add_typer(workspace.workspace_app, name="workspace")
app.add_typer(cluster.app, name="cluster")
app.add_typer(workspace.experiment_app, name="experiment")
app.add_typer(job.app, name="job")
app.add_typer(datastore.app, name="datastore")
schema_app = typer.Typer(help="JSON Schemas of the file formats.", no_args_is_help=True)
app.add_typer(schema_app, name="schema")


@schema_app.command("job")
def schema_job() -> None:
    """Print the JSON Schema of the native job YAML."""
    from batchyard.spec.job import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@app.command("usage")
def usage(workspace: str = common.WorkspaceOpt,
          output: common.Output = common.OutputOpt) -> None:
    """vCPU and GPU use per node family against the workspace's quota."""
    with common.handled():
        rows = common.client().get(f"/workspaces/{common.ws_name(workspace)}"
                                           "/usage")
        common.emit(rows, output, lambda d: common.table(d, [
            ("family", "Family"), ("vcpus_in_use", "vCPU in use"),
            ("vcpus_allocated", "vCPU allocated"), ("vcpu_limit", "vCPU limit"),
            ("gpus_in_use", "GPU in use"), ("gpu_limit", "GPU limit")]))


quota_app = typer.Typer(help="Workspace quotas (admin).", no_args_is_help=True)
app.add_typer(quota_app, name="quota")


@quota_app.command("set")
def quota_set(family: str = typer.Option(..., "--family", help="e.g. standardNCFamily"),
              vcpus: int = typer.Option(None, "--vcpus", help="vCPU limit (omit: none)."),
              gpus: int = typer.Option(None, "--gpus", help="GPU limit (omit: none)."),
              workspace: str = common.WorkspaceOpt,
              output: common.Output = common.OutputOpt) -> None:
    """Set a workspace's limit for one node family."""
    with common.handled():
        data = common.client().request(
            "PUT", f"/workspaces/{common.ws_name(workspace)}/quotas",
            json={"family": family, "vcpus": vcpus, "gpus": gpus})
        common.emit(data, output, lambda d: common.console.print(
            f"quota for {d['family']}: {d['vcpu_limit']} vCPUs, {d['gpu_limit']} GPUs"))


@app.command("version")
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
