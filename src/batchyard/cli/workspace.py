"""`batchyard workspace` and `batchyard experiment`."""

from __future__ import annotations

from typing import Any

import typer

from batchyard.cli import complete, groups
from batchyard.cli.common import (
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    counts,
    emit,
    handled,
    human_time,
    key_values,
    name_arg,
    pick_name,
    table,
    ws_name,
)

workspace_app = groups.workspace
experiment_app = groups.experiment

WS_COLUMNS = [("name", "Name"), ("location", "Location"), ("resource_group", "Resource group"),
              ("created", "Created", "id?")]
RG_HIDDEN = typer.Option(None, "--resource-group", "-g", hidden=True)


def _ws_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "created": human_time(r.get("created_at"))} for r in rows]


@workspace_app.command("create")
def ws_create(
    name_arg_: str = name_arg("workspace"),
    name: str = typer.Option(None, "--name", "-n", help="Workspace name (or give it as NAME)."),
    location: str = typer.Option(None, "--location", "-l", help="Recorded, as in Azure."),
    resource_group: str = typer.Option(None, "--resource-group", "-g", help="Recorded."),
    output: Output = OutputOpt,
) -> None:
    """Create a workspace."""
    with handled():
        name = pick_name(name_arg_, name, "workspace")
        data = client().post("/workspaces", {"name": name, "location": location,
                                             "resource_group": resource_group})
        emit(data, output, lambda d: console.print(f"workspace {d['name']} created",
                                                   highlight=False))


@workspace_app.command("list")
def ws_list(output: Output = OutputOpt, resource_group: str = RG_HIDDEN) -> None:
    """List workspaces."""
    with handled():
        emit(client().get("/workspaces"), output,
             lambda d: table(_ws_rows(d), WS_COLUMNS, empty="no workspaces"))


@workspace_app.command("show")
def ws_show(name_arg_: str = name_arg("workspace"),
            name: str = typer.Option(None, "--name", "-n", help="Workspace name (default: "
                                     "'default'; or give it as NAME)."),
            output: Output = OutputOpt, resource_group: str = RG_HIDDEN) -> None:
    """Show a workspace."""
    with handled():
        if name_arg_ and name:
            pick_name(name_arg_, name, "workspace")
        name = name_arg_ or name or "default"
        emit(client().get(f"/workspaces/{name}"), output,
             lambda d: key_values({**d, "created": human_time(d.get("created_at"))},
                                  [("name", "Name"), ("location", "Location"),
                                   ("resource_group", "Resource group"),
                                   ("subscription_id", "Subscription"),
                                   ("mlflow_uri", "MLflow tracking URI"),
                                   ("created", "Created")]))


@workspace_app.command("update")
def ws_update(name_arg_: str = name_arg("workspace"),
              name: str = typer.Option(None, "--name", "-n", help="Workspace name (or give "
                                       "it as NAME)."),
              mlflow_uri: str = typer.Option(None, "--mlflow-uri", metavar="URL",
                                             help="An external MLflow tracking server the "
                                             "workspace's jobs log to (their ranks get it as "
                                             "MLFLOW_TRACKING_URI); '' for batchyard's own."),
              output: Output = OutputOpt, resource_group: str = RG_HIDDEN) -> None:
    """Change a workspace's settings."""
    with handled():
        name = pick_name(name_arg_, name, "workspace")
        if mlflow_uri is None:
            from batchyard.cli.common import fail

            fail("nothing to change: give --mlflow-uri URL ('' for batchyard's own)")
        data = client().request("PATCH", f"/workspaces/{name}", json={"mlflow_uri": mlflow_uri})
        emit(data, output, lambda d: console.print(
            f"workspace {d['name']}: MLflow tracking "
            + (f"at {d['mlflow_uri']}" if d.get("mlflow_uri") else "by batchyard itself"),
            highlight=False, markup=False))


@workspace_app.command("delete")
def ws_delete(name_arg_: str = name_arg("workspace"),
              name: str = typer.Option(None, "--name", "-n", help="Workspace name (or give "
                                       "it as NAME)."),
              output: Output = OutputOpt, resource_group: str = RG_HIDDEN,
              yes: bool = typer.Option(False, "--yes", "-y", hidden=True)) -> None:
    """Delete a workspace (it must have no clusters or active jobs)."""
    with handled():
        name = pick_name(name_arg_, name, "workspace")
        client().delete(f"/workspaces/{name}")
        emit({"deleted": name}, output, lambda d: console.print(f"workspace {name} deleted",
                                                                highlight=False))


EXP_COLUMNS = [("name", "Name"), ("jobs", "Jobs", "num"), ("states", "Job states", "text"),
               ("created", "Created", "id?")]
ExpNameOpt = typer.Option(None, "--name", "-n", help="Experiment name (or give it as NAME).",
                          autocompletion=complete.experiments)


def _exp_row(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "states": counts(d.get("job_states")) if d.get("jobs") else "-",
            "created": human_time(d.get("created_at"))}


@experiment_app.command("create")
def exp_create(name_arg_: str = name_arg("experiment"), name: str = ExpNameOpt,
               workspace: str = WorkspaceOpt, output: Output = OutputOpt,
               resource_group: str = RG_HIDDEN) -> None:
    """Create an experiment."""
    with handled():
        name = pick_name(name_arg_, name, "experiment")
        data = client().post(f"/workspaces/{ws_name(workspace)}/experiments", {"name": name})
        emit(data, output, lambda d: console.print(f"experiment {d['name']} created",
                                                   highlight=False))


@experiment_app.command("list")
def exp_list(workspace: str = WorkspaceOpt, output: Output = OutputOpt,
             resource_group: str = RG_HIDDEN) -> None:
    """List experiments."""
    with handled():
        emit(client().get(f"/workspaces/{ws_name(workspace)}/experiments"), output,
             lambda d: table([_exp_row(e) for e in d], EXP_COLUMNS,
                             empty=f"no experiments in workspace {ws_name(workspace)}"))


@experiment_app.command("show")
def exp_show(name_arg_: str = name_arg("experiment"), name: str = ExpNameOpt,
             workspace: str = WorkspaceOpt, output: Output = OutputOpt,
             resource_group: str = RG_HIDDEN) -> None:
    """Show an experiment."""
    with handled():
        name = pick_name(name_arg_, name, "experiment")
        emit(client().get(f"/workspaces/{ws_name(workspace)}/experiments/{name}"), output,
             lambda d: key_values(_exp_row(d), [("name", "Name"), ("jobs", "Jobs"),
                                                ("states", "Job states"),
                                                ("created", "Created")]))


@experiment_app.command("delete")
def exp_delete(name_arg_: str = name_arg("experiment"), name: str = ExpNameOpt,
               workspace: str = WorkspaceOpt, output: Output = OutputOpt,
               resource_group: str = RG_HIDDEN,
               yes: bool = typer.Option(False, "--yes", "-y", hidden=True)) -> None:
    """Delete an experiment and its finished jobs."""
    with handled():
        name = pick_name(name_arg_, name, "experiment")
        client().delete(f"/workspaces/{ws_name(workspace)}/experiments/{name}")
        emit({"deleted": name}, output, lambda d: console.print(f"experiment {name} deleted",
                                                                highlight=False))
