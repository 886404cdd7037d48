"""`batchyard job stacks`: a stack dump of every rank of a running job, on demand, folded
so that identical stacks make one group and the rank stuck elsewhere stands out; and the
dumps kept with the job's attempts (the hang watchdog's and earlier requests)."""

from __future__ import annotations

import time
from typing import Any

import typer

from batchyard.cli.common import (
    EXIT_ERROR,
    ExperimentOpt,
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    emit,
    err_console,
    fail,
    handled,
    human_time,
    name_arg,
    name_opt,
    pick_name,
    stderr_is_tty,
    table,
)

WAIT_STEP = 60.0  # the server's longest wait per call


def _print(lines: list[str]) -> None:
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def render(found: dict[str, Any], raw: bool) -> None:
    from batchyard.debug.stacks import group, render_raw
    from batchyard.debug.stacks import render as render_groups

    answered = len(found["dumps"])
    ranks = sum(len(d.get("ranks") or []) for d in found["dumps"])
    _print([f"stack dump {found['id']} ({found['reason']}) of attempt {found['attempt']}, "
            f"{human_time(found.get('requested_at'))}: {ranks} rank(s) on {answered} of "
            f"{len(found.get('nodes') or [])} node(s)"])
    _print(render_raw(found["dumps"]) if raw else render_groups(group(found["dumps"])))
    for dump in found["dumps"]:
        if dump.get("note") and not raw:
            _print([f"note: node {dump.get('node')}: {dump['note']}"])
    if found["missing"]:
        err_console.print(f"no answer from node(s) {', '.join(found['missing'])}",
                          highlight=False, markup=False, soft_wrap=True)


def _wait(c: Any, path: str, ident: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status = err_console.status("waiting for every node's dump") if stderr_is_tty() else None
    if status is not None:
        status.__enter__()
    try:
        while True:
            left = max(0.0, deadline - time.monotonic())
            found: dict[str, Any] = c.get(f"{path}/stacks/{ident}",
                                          wait=round(min(left, WAIT_STEP), 1))
            if found["complete"] or left <= 0 or found.get("attempt_state") not in (
                    "running", "stopping"):
                return found
            if status is not None:
                status.update(f"waiting for {', '.join(found['missing'])}")
    finally:
        if status is not None:
            status.__exit__(None, None, None)


def _with_groups(found: dict[str, Any]) -> dict[str, Any]:
    from batchyard.debug.stacks import group

    return {**found, "groups": [g.to_dict() for g in group(found["dumps"])]}


def stacks(name_arg_: str = name_arg("job"),
           name: str = name_opt("job"),
           workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
           list_: bool = typer.Option(False, "--list", help="List the dumps kept with the "
                                      "job's attempts (hangs and earlier requests)."),
           ident: str = typer.Option(None, "--id", help="Show this kept dump, not a new one."),
           raw: bool = typer.Option(False, "--raw", help="Every process and thread, native "
                                    "frames too, not folded."),
           timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for every "
                                         "node's answer."),
           output: Output = OutputOpt) -> None:
    """Dump the stacks of every rank of a running job (py-spy), grouped: identical stacks
    fold together, so the rank stuck elsewhere stands out.

    Waits for every node's answer (--timeout) and names the nodes that did not answer.
    The dump is kept with the attempt: --list and --id show kept ones."""
    with handled():
        from batchyard.cli.job import locate

        if timeout <= 0:
            fail("--timeout: a number of seconds above 0")
        if list_ and ident:
            fail("--list and --id: give one")
        c = client()
        path, _ = locate(c, workspace, experiment, pick_name(name_arg_, name, "job"))
        if list_:
            rows = c.get(path + "/stacks")
            emit(rows, output, lambda d: table(
                [{**r, "when": human_time(r.get("requested_at")),
                  "answered": f"{len(r['nodes']) - len(r['missing'])}/{len(r['nodes'])}"}
                 for r in d],
                [("id", "Id"), ("attempt", "Attempt", "num"), ("reason", "Reason"),
                 ("when", "Requested"), ("answered", "Nodes answered", "num")],
                empty="no stack dumps kept for this job"))
            return
        if ident is None:
            ident = c.post(path + "/stacks")["id"]
            found = _wait(c, path, ident, timeout)
        else:
            found = c.get(f"{path}/stacks/{ident}")
        emit(_with_groups(found), output, lambda d: render(d, raw))
        if not found["dumps"]:
            raise typer.Exit(EXIT_ERROR)
