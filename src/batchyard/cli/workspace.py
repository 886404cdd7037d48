"""`batchyard workspace` and `batchyard experiment`."""

from __future__ import annotations

import typer

from batchyard.cli.common import (
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    emit,
    handled,
    key_values,
    table,
    ws_name,
)

workspace_app = typer.Typer(help="Workspaces: namespaces for clusters, experiments and jobs.",
                            no_args_is_help=True)
experiment_app = typer.Typer(help="Experiments: named groups of jobs.", no_args_is_help=True)

WS_COLUMNS = [("name", "Name"), ("location", "Location"), ("resource_group", "Resource group")]


@workspace_app.command("create")
def ws_create(
    name: str = typer.Option(..., "--name", "-n", help="Workspace name."),
    location: str = typer.Option(None, "--location", "-l", help="Recorded, as in Azure."),
    resource_group: str = typer.Option(None, "--resource-group", "-g", help="Recorded."),
    output: Output = OutputOpt,
) -> None:
    """Create a workspace."""
    with handled():
        data = client().post("/workspaces", {"name": name, "location": location,
                                             "resource_group": resource_group})
        emit(data, output, lambda d: console.print(f"workspace {d['name']} created"))


@workspace_app.command("list")
def ws_list(output: Output = OutputOpt,
            resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
            ) -> None:
    """List workspaces."""
    with handled():
        emit(client().get("/workspaces"), output, lambda d: table(d, WS_COLUMNS))


@workspace_app.command("show")
def ws_show(name: str = typer.Option("default", "--name", "-n"), output: Output = OutputOpt,
            resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
            ) -> None:
    """Show a workspace."""
    with handled():
        emit(client().get(f"/workspaces/{name}"), output,
             lambda d: key_values(d, ["name", "location", "resource_group", "clusters",
                                      "experiments"]))


@workspace_app.command("delete")
def ws_delete(name: str = typer.Option(..., "--name", "-n"), output: Output = OutputOpt,
              resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True),
              yes: bool = typer.Option(False, "--yes", "-y", hidden=True)) -> None:
    """Delete a workspace (it must have no clusters or active jobs)."""
    with handled():
        client().delete(f"/workspaces/{name}")
        emit({"deleted": name}, output, lambda d: console.print(f"workspace {name} deleted"))


EXP_COLUMNS = [("name", "Name"), ("jobs", "Jobs"), ("job_states", "States")]


@experiment_app.command("create")
def exp_create(name: str = typer.Option(..., "--name", "-n"), workspace: str = WorkspaceOpt,
               output: Output = OutputOpt,
               resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
               ) -> None:
    """Create an experiment."""
    with handled():
        data = client().post(f"/workspaces/{ws_name(workspace)}/experiments", {"name": name})
        emit(data, output, lambda d: console.print(f"experiment {d['name']} created"))


@experiment_app.command("list")
def exp_list(workspace: str = WorkspaceOpt, output: Output = OutputOpt,
             resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
             ) -> None:
    """List experiments."""
    with handled():
        emit(client().get(f"/workspaces/{ws_name(workspace)}/experiments"), output,
             lambda d: table(d, EXP_COLUMNS))


@experiment_app.command("show")
def exp_show(name: str = typer.Option(..., "--name", "-n"), workspace: str = WorkspaceOpt,
             output: Output = OutputOpt,
             resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
             ) -> None:
    """Show an experiment."""
    with handled():
        emit(client().get(f"/workspaces/{ws_name(workspace)}/experiments/{name}"), output,
             lambda d: key_values(d, ["name", "jobs", "job_states"]))


@experiment_app.command("delete")
def exp_delete(name: str = typer.Option(..., "--name", "-n"), workspace: str = WorkspaceOpt,
               output: Output = OutputOpt,
               resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True),
               yes: bool = typer.Option(False, "--yes", "-y", hidden=True)) -> None:
    """Delete an experiment and its finished jobs."""
    with handled():
        client().delete(f"/workspaces/{ws_name(workspace)}/experiments/{name}")
        emit({"deleted": name}, output, lambda d: console.print(f"experiment {name} deleted"))


