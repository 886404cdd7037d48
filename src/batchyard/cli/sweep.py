"""`batchyard sweep` (create/list/show/cancel/wait): hyperparameter sweeps whose trials are
jobs. The file is a native job YAML with a `sweep:` block or an Azure ML `type: sweep` YAML."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from batchyard import errors
from batchyard.cli import complete, groups
from batchyard.cli.common import (
    EXIT_ERROR,
    ExperimentOpt,
    ListExperimentOpt,
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    emit,
    fail,
    handled,
    key_values,
    name_arg,
    pick_name,
    table,
    ws_name,
)

if TYPE_CHECKING:
    from batchyard.client.http import Client

app = groups.sweep
SweepNameOpt = typer.Option(None, "--name", "-n", help="The sweep's name (or give it as NAME).",
                            autocompletion=complete.sweeps)
TERMINAL = ("succeeded", "failed", "canceled")
LIST_COLUMNS = [("name", "Name"), ("experiment", "Experiment", "id?"),
                ("cluster", "Cluster", "id?"), ("state", "State"),
                ("progress", "Trials"), ("best_text", "Best", "text")]
TRIAL_COLUMNS = [("index", "Trial", "num"), ("name", "Job", "id?"), ("params_text", "Params",
                                                                      "text"),
                 ("state", "State"), ("objective", "Objective", "num"),
                 ("why", "Reason / message", "text")]


def sweep_path(workspace: str, experiment: str, name: str) -> str:
    from urllib.parse import quote

    return f"/workspaces/{quote(workspace, safe='')}/experiments/" \
        f"{quote(experiment, safe='')}/sweeps/{quote(name, safe='')}"


def locate(c: Client, workspace: str | None, experiment: str | None, name: str) -> str:
    """The API path of sweep ``name``: in -e's experiment, else the one sweep of that name
    in the workspace (several: an error naming their experiments)."""
    ws = ws_name(workspace)
    if experiment:
        return sweep_path(ws, experiment, name)
    found = [s for s in c.get(f"/workspaces/{ws}/sweeps") if s["name"] == name]
    if not found:
        raise errors.NotFound(f"sweep {name!r} not found in workspace {ws!r}")
    if len(found) > 1:
        exps = ", ".join(sorted(s["experiment"] for s in found))
        raise errors.UserError(f"{len(found)} sweeps are named {name!r} (experiments {exps}): "
                               "give -e EXPERIMENT")
    return sweep_path(ws, found[0]["experiment"], name)


def _params_text(params: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in params.items())


def _summary(d: dict[str, Any]) -> dict[str, Any]:
    states = ", ".join(f"{n} {s}" for s, n in sorted(d.get("trial_states", {}).items()))
    total = (d.get("limits") or {}).get("max_total_trials")
    best = d.get("best")
    metric = (d.get("objective") or {}).get("primary_metric")
    return {**d, "progress": f"{d.get('trials_created', 0)}/{total}" + (f" ({states})"
                                                                          if states else ""),
            "best_text": f"{best['name']}: {metric} {best['objective']:g}" if best else "-",
            "objective_text": f"{metric} ({(d.get('objective') or {}).get('goal')})"}


def render_show(d: dict[str, Any]) -> None:
    row = _summary(d)
    key_values(row, [("name", "Sweep"), ("experiment", "Experiment"), ("cluster", "Cluster"),
                     ("state", "State"), ("message", "Message"), ("sampling", "Sampling"),
                     ("objective_text", "Objective"), ("progress", "Trials"),
                     ("best_text", "Best")])
    rows = [{**t, "params_text": _params_text(t.get("params") or {}),
             "why": t.get("stopped_by") or t.get("message")} for t in d.get("trials") or []]
    table(rows, TRIAL_COLUMNS, title="Trials (best first)", empty="no trials yet")


@app.command("create")
def create(
    file: Path = typer.Option(..., "--config-file", "-f", help="Sweep file: native YAML with "
                              "a `sweep:` block, or AML v2 `type: sweep` YAML."),
    name: str = typer.Option(None, "--name", "-n", help="Sweep name (default: from the file)."),
    cluster: str = typer.Option(None, "--cluster", "-c", help="Cluster the trials run on.",
                                autocompletion=complete.clusters),
    workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
    wait: bool = typer.Option(False, "--wait", help="Wait until the sweep ends; exit 0 if it "
                              "succeeded, 1 if not."),
    output: Output = OutputOpt,
) -> None:
    """Create a sweep: trials are sampled and submitted as jobs by the server."""
    with handled():
        from batchyard.snapshot import pack
        from batchyard.spec.sweep import load_sweep_file

        if not file.is_file():
            fail(f"--config-file: {file} does not exist")
        spec, source_format = load_sweep_file(file)
        body = spec.model_dump(mode="json", exclude_none=True)
        c = client()
        code = spec.trial.code
        if code and not code.startswith("snapshot:"):
            body["trial"]["code"] = f"snapshot:{c.upload_snapshot(pack(code))}"
        result = c.post(f"/workspaces/{ws_name(workspace)}/sweeps", {
            "spec": body, "experiment": experiment, "cluster": cluster, "name": name,
            "source_format": source_format})
        if wait:
            result = _wait(c, sweep_path(ws_name(workspace), result["experiment"],
                                         result["name"]), None)
            emit(result, output, render_show)
            raise typer.Exit(0 if result["state"] == "succeeded" else EXIT_ERROR)
        emit(result, output, lambda d: console.print(
            f"sweep {d['name']} created on cluster {d['cluster']} (experiment "
            f"{d['experiment']}): {d['limits'].get('max_total_trials')} trials, "
            f"{d['sampling']} sampling; follow it with `batchyard sweep show {d['name']}`",
            highlight=False, markup=False, soft_wrap=True))


def _wait(c: Client, path: str, timeout: float | None) -> dict[str, Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    data: dict[str, Any] = c.get(path)
    while data["state"] not in TERMINAL:
        if deadline is not None and time.monotonic() > deadline:
            break
        time.sleep(1.0)
        data = c.get(path)
    return data


@app.command("list")
def list_(workspace: str = WorkspaceOpt, experiment: str = ListExperimentOpt,
          output: Output = OutputOpt) -> None:
    """List sweeps (all experiments unless -e is given)."""
    with handled():
        rows = client().get(f"/workspaces/{ws_name(workspace)}/sweeps", experiment=experiment)
        emit(rows, output, lambda d: table([_summary(r) for r in d], LIST_COLUMNS,
                                           empty="no sweeps"))


@app.command("show")
def show(name_arg_: str = name_arg("sweep"), name: str = SweepNameOpt,
         workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
         output: Output = OutputOpt) -> None:
    """Show a sweep and its trials (params, state, objective), best first."""
    with handled():
        c = client()
        path = locate(c, workspace, experiment, pick_name(name_arg_, name, "sweep"))
        emit(c.get(path), output, render_show)


@app.command("wait")
def wait_(name_arg_: str = name_arg("sweep"), name: str = SweepNameOpt,
          workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
          timeout: float = typer.Option(None, "--timeout", help="Give up after this many s."),
          output: Output = OutputOpt) -> None:
    """Wait for a sweep to end; exit 0 if it succeeded, 1 if not."""
    with handled():
        c = client()
        path = locate(c, workspace, experiment, pick_name(name_arg_, name, "sweep"))
        data = _wait(c, path, timeout)
        emit(data, output, render_show)
        if data["state"] not in TERMINAL:
            fail(f"sweep {data['name']} still {data['state']} after {timeout:g}s", EXIT_ERROR)
        raise typer.Exit(0 if data["state"] == "succeeded" else EXIT_ERROR)


@app.command("cancel")
def cancel(name_arg_: str = name_arg("sweep"), name: str = SweepNameOpt,
           workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
           output: Output = OutputOpt) -> None:
    """Cancel a sweep: no more trials, running ones are stopped."""
    with handled():
        c = client()
        path = locate(c, workspace, experiment, pick_name(name_arg_, name, "sweep"))
        data = c.post(path + "/cancel")
        emit(data, output, lambda d: console.print(
            f"sweep {d['name']}: {d['state']}" + (" (cancel requested; running trials are "
                                                  "being stopped)" if d["state"] == "running"
                                                  else ""),
            highlight=False, markup=False, soft_wrap=True))
