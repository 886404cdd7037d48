"""`batchyard cluster quota set|list|remove`: a team's guaranteed capacity on a cluster
(issue 35 §2). What a team leaves idle other teams may borrow; when it needs it back, the
borrowed jobs are preempted (SIGTERM, the cluster's grace period) and requeued."""

from __future__ import annotations

from typing import Any

import typer

import batchyard.cli.cluster_join  # noqa: F401  (the rest of `cluster`'s commands)
from batchyard.cli.cluster import app
from batchyard.cli.common import (
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    emit,
    handled,
    table,
    ws_name,
)
from batchyard.errors import SpecError

quota_app = typer.Typer(help="Teams' guaranteed capacity on a cluster (admins set it).",
                        no_args_is_help=True)
app.add_typer(quota_app, name="quota")
ClusterOpt = typer.Option(..., "--cluster", "-c", help="The cluster.")


def _path(workspace: str | None, cluster: str) -> str:
    return f"/workspaces/{ws_name(workspace)}/clusters/{cluster}/guarantees"


def _text(d: dict[str, Any]) -> str:
    limit = "no borrow limit" if d["borrow_limit"] is None else \
        f"borrows at most {d['borrow_limit']} {d['unit']}"
    return (f"team {d['team']} is guaranteed {d['guaranteed']} {d['unit']} on cluster "
            f"{d['cluster']} ({limit}); {d['in_use']} in use")


@quota_app.command("set")
def quota_set(cluster: str = ClusterOpt,
              team: str = typer.Option(..., "--team", help="The team."),
              gpus: int = typer.Option(None, "--gpus", min=0, help="GPUs guaranteed (whole "
                                       "nodes' worth), on a cluster whose nodes have GPUs."),
              nodes: int = typer.Option(None, "--nodes", min=0, help="Nodes guaranteed (any "
                                        "cluster; the unit of a cluster without GPUs)."),
              borrow_limit: int = typer.Option(None, "--borrow-limit", min=0, help="How much "
                                               "the team may use beyond its guarantee, in "
                                               "the same unit (default: no limit)."),
              workspace: str = WorkspaceOpt, output: Output = OutputOpt) -> None:
    """Guarantee a team part of a cluster (server admins). The team may always use it;
    what it leaves idle others borrow, and give back when it needs it."""
    with handled():
        if (gpus is None) == (nodes is None):
            raise SpecError("--gpus: give the guarantee as --gpus or as --nodes (one of them)")
        data = client().request("PUT", f"{_path(workspace, cluster)}/{team}", json={
            "gpus": gpus, "nodes": nodes, "borrow_limit": borrow_limit})
        emit(data, output, lambda d: console.print(_text(d), highlight=False, markup=False))


@quota_app.command("list")
def quota_list(cluster: str = ClusterOpt, workspace: str = WorkspaceOpt,
               output: Output = OutputOpt) -> None:
    """The teams' guarantees on a cluster, and what each uses now."""
    with handled():
        rows = client().get(_path(workspace, cluster))
        shown = [{**r, "limit": "-" if r["borrow_limit"] is None else r["borrow_limit"]}
                 for r in rows]
        emit(rows, output, lambda _: table(shown, [
            ("team", "Team"), ("guaranteed", "Guaranteed", "num"), ("unit", "Unit"),
            ("limit", "Borrow limit", "num"), ("in_use", "In use", "num")],
            empty=f"no guarantees on cluster {cluster}"))


@quota_app.command("remove")
def quota_remove(cluster: str = ClusterOpt,
                 team: str = typer.Option(..., "--team", help="The team."),
                 workspace: str = WorkspaceOpt, output: Output = OutputOpt) -> None:
    """Remove a team's guarantee on a cluster (server admins)."""
    with handled():
        data = client().request("DELETE", f"{_path(workspace, cluster)}/{team}")
        emit(data, output, lambda d: console.print(
            f"team {d['team']} has no guarantee on cluster {d['cluster']} any more",
            highlight=False, markup=False))
