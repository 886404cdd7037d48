"""`batchyard job` (create/list/show/logs/wait/terminate/delete, file list/download)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from batchyard import errors
from batchyard.cli import complete, groups
from batchyard.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    ExperimentOpt,
    ListExperimentOpt,
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    cluster_opt,
    console,
    emit,
    err_console,
    exp_name,
    fail,
    handled,
    human_time,
    key_values,
    name_arg,
    pick_name,
    stderr_is_tty,
    table,
    ws_name,
)
from batchyard.cli.job_create import create  # noqa: F401  (registers `job create` first)
from batchyard.states import JOB_STATES, JOB_TERMINAL

if TYPE_CHECKING:
    from batchyard.client.http import Client


def format_duration(seconds: float | None) -> str:
    """``spec.durations.format_duration``, imported when first needed (start-up)."""
    from batchyard.spec.durations import format_duration as fmt

    return fmt(seconds)


app = groups.job

TERMINAL = JOB_TERMINAL
WAITING = ("queued", "preparing")  # before the ranks run: nothing in the logs yet
COLUMNS = [("name", "Name"), ("experiment", "Experiment", "id?"),
           ("cluster", "Cluster", "id?"), ("state", "State"), ("created_by", "By", "id??"),
           ("nodes_x", "Nodes", "id?"),
           ("dur", "Duration", "id?"), ("exit_code", "Exit", "num?"),
           ("why", "Reason / message", "cut")]
RG = typer.Option(None, "--resource-group", "-g", hidden=True)
JobNameOpt = typer.Option(None, "--name", "-n", help="The job's name (or give it as NAME).",
                          autocompletion=complete.jobs)


def grouped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``cli.arrays.grouped``: a job array's jobs as one row (imported when first used)."""
    if not any(r.get("array") for r in rows):
        return rows
    from batchyard.cli.arrays import grouped as group

    return group(rows)


def _row(j: dict[str, Any]) -> dict[str, Any]:
    if "nodes" not in j:  # a job array's row: cli.arrays made it
        return j
    return {**j, "nodes_x": f"{j['nodes']} x {j['processes_per_node']}",
            "dur": format_duration(j.get("duration")) if j.get("duration") else "-",
            "why": j.get("pending_reason") or j.get("message")}


SHOW_FIELDS = [("name", "Name"), ("experiment", "Experiment"), ("workspace", "Workspace"),
               ("cluster", "Cluster"), ("state", "State"), ("pending_reason", "Pending reason"),
               ("estimated", "Estimated start"), ("capacity", "Capacity"),
               ("checkpoint", "Last checkpoint"),
               ("created_by", "Submitted by"),
               ("message", "Message"), ("exit_code", "Exit code"), ("priority", "Priority"),
               ("nodes_x", "Nodes x processes"), ("distribution", "Distribution"),
               ("attempt", "Attempt"), ("submitted", "Submitted"), ("dur", "Duration"),
               ("assigned_nodes", "Nodes"), ("source_format", "Job file format"),
               ("metrics", "Latest metrics"), ("straggler_text", "Straggler")]


def _render_show(j: dict[str, Any]) -> None:
    row = _row(j)
    row["submitted"] = human_time(j.get("submitted_at"))
    if j.get("state") == "queued" and "estimate" in j:
        from batchyard.cli.whatif import estimate_text

        row["estimated"] = estimate_text(j)
    saved = j.get("checkpoint") or {}
    if saved.get("at"):
        step = f"step {saved['step']}, " if saved.get("step") is not None else ""
        row["checkpoint"] = f"{step}{human_time(saved['at'])}"
    for key in ("pending_reason", "capacity", "checkpoint", "message", "exit_code",
                "assigned_nodes", "metrics", "straggler_text"):
        if row.get(key) in (None, [], {}):
            row.pop(key, None)
    key_values(row, SHOW_FIELDS)
    from batchyard.cli.failures import render_error
    from batchyard.cli.observe import render as render_observed

    render_error(j)
    render_observed(j)  # params, GPU utilisation, the MLflow run
    if j.get("attempts"):
        table([{**a, "took": format_duration((a["ended_at"] or time.time()) -
                                             (a["started_at"] or a["created_at"]))}
               for a in j["attempts"]],
              [("number", "Attempt", "num"), ("state", "State"), ("exit_code", "Exit", "num"),
               ("took", "Took"), ("message", "Message", "text"), ("uuid", "Id", "id?")],
              title="Attempts")


def _path(workspace: str | None, experiment: str | None, name: str) -> str:
    from batchyard.client.http import Client

    return Client.job_path(ws_name(workspace), exp_name(experiment), name)


def locate(c: Client, workspace: str | None, experiment: str | None, name: str
           ) -> tuple[str, dict[str, Any] | None]:
    """The API path of job ``name`` (and the job, when finding it fetched it). Without -e:
    the default experiment's job of that name, else the one job of that name in the whole
    workspace; several are an error naming their experiments."""
    ws = ws_name(workspace)
    if experiment:
        return c.job_path(ws, experiment, name), None
    path = c.job_path(ws, "default", name)
    try:
        return path, c.get(path)
    except errors.NotFound:
        pass
    every = [j for page in c.pages(f"/workspaces/{ws}/jobs", limit=1000) for j in page]
    found = [j for j in every if j["name"] == name]
    if not found:
        from batchyard.suggest import did_you_mean

        raise errors.NotFound(f"job {name!r} not found in workspace {ws!r} (in no experiment)"
                              + did_you_mean(name, [j["name"] for j in every]))
    if len(found) > 1:
        exps = ", ".join(sorted(j["experiment"] for j in found))
        raise errors.UserError(f"{len(found)} jobs are named {name!r} in workspace {ws!r} "
                               f"(experiments {exps}): give -e EXPERIMENT")
    return c.job_path(ws, found[0]["experiment"], name), None


def reattach(job: dict[str, Any]) -> str:
    """The command that follows this job again."""
    flags = ""
    if job.get("experiment") not in (None, "default"):
        flags += f" -e {job['experiment']}"
    if job.get("workspace") not in (None, "default"):
        flags += f" -w {job['workspace']}"
    return f"batchyard job logs -f {job['name']}{flags}"


@contextmanager
def _detachable(job: dict[str, Any], doing: str) -> Iterator[None]:
    """Ctrl-C while following: the job keeps running; say how to come back to it."""
    try:
        yield
    except KeyboardInterrupt:
        err_console.print(f"\nstopped {doing}; job {job['name']} goes on (Ctrl-C does not "
                          f"stop it: `batchyard job terminate` does). Re-attach with: "
                          f"{reattach(job)}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def job_exit_code(job: dict[str, Any]) -> int:
    """`job wait` exits as the job did: its exit code, 1 if it failed without one, 130 if it
    was canceled."""
    if job["state"] == "succeeded":
        return 0
    if job["state"] == "canceled":
        return EXIT_INTERRUPTED
    code = job.get("exit_code")
    return int(code) if code not in (None, 0) else EXIT_ERROR


def final_line(j: dict[str, Any]) -> str:
    """How a job ended, in one line: `job j1 failed with exit code 7 after 3.2s: ...`."""
    took = format_duration(j.get("duration")) if j.get("duration") else None
    state, message = j["state"], j.get("message")
    if state == "succeeded":
        text = f"job {j['name']} succeeded" + (f" in {took}" if took else "")
    elif state == "failed":
        code = j.get("exit_code")
        text = f"job {j['name']} failed" + (f" with exit code {code}" if code else "") \
            + (f" after {took}" if took else "")
    elif state == "canceled" and not j.get("started_at"):
        text, message = f"job {j['name']} canceled before it started (it was queued)", None
    elif state == "canceled":
        text = f"job {j['name']} canceled" + (f" after {took}" if took else "")
    else:
        text = f"job {j['name']} is {describe(j)}"
        message = None
    held = j.get("pending_reason") if state == "failed" else None  # keep_alive_on_failure
    return text + (f": {message}" if message else "") + (f"; {held}" if held else "")


def describe(j: dict[str, Any]) -> str:
    """The state of a job that has not ended, with why it waits or where it runs."""
    state = j["state"]
    if state == "queued":
        reason = j.get("pending_reason")
        return "queued" + (f": {reason}" if reason else "")
    nodes = j.get("assigned_nodes")
    where = f" on {', '.join(nodes)}" if nodes else ""
    if state == "preparing":
        return f"preparing{where} (staging code and inputs, prepare command)"
    if state == "finalizing":
        return "finalizing (uploading outputs)"
    return f"{state}{where}"


class _Progress:
    """A job's state as it changes. On a terminal: a Rich status line (spinner, state, pending
    reason, time waited) and a line kept per state change; elsewhere one plain line on
    stderr per change of state or pending reason."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.last: tuple[Any, ...] | None = None
        self.started = time.monotonic()
        self.status: Any = None

    def __enter__(self) -> _Progress:
        if stderr_is_tty():
            self.status = err_console.status(f"job {self.name}")
            self.status.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def show(self, job: dict[str, Any]) -> None:
        seen: tuple[Any, ...] = (job["state"], tuple(job.get("assigned_nodes") or ()))
        if self.status is None:  # plain lines: the reason's changes too
            seen += (job.get("pending_reason"),)
        text = f"job {job['name']}: {describe(job)}"
        if seen != self.last and job["state"] not in TERMINAL:
            self.last = seen
            err_console.print(text, highlight=False, markup=False, soft_wrap=True)
        if self.status is not None:
            from rich.markup import escape

            elapsed = format_duration(time.monotonic() - self.started)
            self.status.update(f"{escape(text)} [dim]({elapsed})[/]")


def watch(c: Client, path: str, job: dict[str, Any], until: Callable[[dict[str, Any]], bool],
          *, timeout: float | None = None, quiet: bool = False, poll: float = 0.25,
          get: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Poll the job until ``until(job)`` (or ``timeout``), showing its state changes.
    ``get``: how to read the job (a follower's waits out a restarting server)."""
    deadline = time.monotonic() + timeout if timeout else None
    get = get or c.get
    if until(job):
        return job
    if quiet:
        while not until(job) and not (deadline and time.monotonic() > deadline):
            time.sleep(poll)
            job = get(path)
        return job
    with _Progress(job["name"]) as progress:
        progress.show(job)
        while not until(job):
            if deadline and time.monotonic() > deadline:
                break
            time.sleep(poll)
            job = get(path)
            progress.show(job)
    return job


def _fetch(c: Client, workspace: str | None, experiment: str | None, name: str
           ) -> tuple[str, dict[str, Any]]:
    path, job = locate(c, workspace, experiment, name)
    return path, job if job is not None else c.get(path)


@app.command("wait")
def wait_(name_arg_: str = name_arg("job"), name: str = JobNameOpt,
          workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
          timeout: float = typer.Option(None, "--timeout", help="Give up after this many s."),
          logs_: bool = typer.Option(False, "--logs", help="Stream the logs once it runs, as "
                                     "`job create --wait` does."),
          resource_group: str = RG, output: Output = OutputOpt) -> None:
    """Wait for a job to end; exit with its exit code.

    Shows its state changes and pending reason meanwhile, then prints its final line (on
    stdout: `job NAME failed with exit code 2 ...`), which tells a job's own exit code 2
    from a CLI error (exit 2 with only `error: ...` on stderr)."""
    with handled():
        job_name = pick_name(name_arg_, name, "job")
        c = client()
        path, job = _fetch(c, workspace, experiment, job_name)
        if logs_:
            from batchyard.cli.job_logs import follow

            raise typer.Exit(job_exit_code(follow(c, path, job, output)))
        with _detachable(job, "waiting"):
            job = watch(c, path, job, lambda j: j["state"] in TERMINAL, timeout=timeout)
        if job["state"] not in TERMINAL:
            fail(f"job {job_name} still {job['state']} after {timeout:g}s", EXIT_ERROR)
        emit(job, output, lambda j: console.print(final_line(j), highlight=False,
                                                  markup=False, soft_wrap=True))
        if job["state"] == "failed" and output == Output.table:
            from batchyard.cli.failures import render_error

            render_error(job)
        raise typer.Exit(job_exit_code(job))


@app.command("list")
def list_(workspace: str = WorkspaceOpt, experiment: str = ListExperimentOpt,
          state: str = typer.Option(None, "--state", help="Only jobs in this state: "
                                    + ", ".join(JOB_STATES) + "."),
          cluster: str = cluster_opt("Only jobs of this cluster."),
          mine: bool = typer.Option(False, "--mine", help="Only the jobs you submitted."),
          user: str = typer.Option(None, "--user", "-u", help="Only the jobs this user "
                                   "submitted."),
          limit: int = typer.Option(100, "--limit", help="Show the newest N jobs."),
          every: bool = typer.Option(False, "--all", help="Every job, fetched page by page "
                                     "(JSON is written as the pages come)."),
          resource_group: str = RG, output: Output = OutputOpt) -> None:
    """List jobs, newest first (all experiments unless -e is given)."""
    with handled():
        if limit < 1:
            fail("--limit: 1 or more")
        if state is not None and state not in JOB_STATES:
            fail(f"--state {state!r}: not a job state; one of {', '.join(JOB_STATES)}")
        if mine and user:
            fail("--mine and --user: give one of them")
        c = client()
        path = f"/workspaces/{ws_name(workspace)}/jobs"
        where = {"experiment": experiment, "state": state, "cluster": cluster,
                 "created_by": user, "mine": True if mine else None}
        said = {"experiment": experiment, "state": state, "cluster": cluster,
                "submitted by": user or ("you" if mine else None)}
        empty = "no jobs" + "".join(f", {k} {v}" for k, v in said.items() if v) + \
            f" in workspace {ws_name(workspace)}"
        if every:
            pages = c.pages(path, limit=1000, **where)
            if output == Output.json:
                import json

                sep = "[\n"
                for page in pages:
                    for job in page:
                        sys.stdout.write(sep + json.dumps(job, default=str))
                        sep = ",\n"
                    sys.stdout.flush()
                sys.stdout.write("[]\n" if sep == "[\n" else "\n]\n")
                return
            rows = [job for page in pages for job in page]
            table([_row(j) for j in grouped(rows)], COLUMNS, empty=empty)
            return
        rows, cursor = [], None
        while len(rows) < limit:
            page, cursor = c.page(path, limit=min(1000, limit - len(rows)), cursor=cursor,
                                  **where)
            rows += page
            if not cursor:
                break
        emit(rows, output, lambda d: table([_row(j) for j in grouped(d)], COLUMNS,
                                           empty=empty))
        if cursor and output == Output.table:
            err_console.print(f"(the newest {len(rows)} jobs; --limit N or --all for more)",
                              highlight=False)


@app.command("show")
def show(name_arg_: str = name_arg("job"), name: str = JobNameOpt,
         workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
         resource_group: str = RG, output: Output = OutputOpt) -> None:
    """Show a job: state, pending reason, attempts, latest metrics (secrets redacted)."""
    with handled():
        c = client()
        path, job = _fetch(c, workspace, experiment, pick_name(name_arg_, name, "job"))
        if "jobs" in job and output == Output.table:  # a job array
            from batchyard.cli.arrays import render_array

            render_array(job)
            return
        from batchyard.cli.observe import add_links

        add_links(c, job)  # the MLflow run's page
        if output == Output.table:  # the latest value of each metric (all: `job metrics`)
            from batchyard.sdk.metrics import decode

            rows = c.get(path + "/metrics")
            if rows:
                job["metrics"] = {r["name"]: decode(r["value"]) for r in rows}
        emit(job, output, _render_show)


@app.command("terminate")
def terminate(name_arg_: str = name_arg("job"), name: str = JobNameOpt,
              workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
              no_wait: bool = typer.Option(False, "--no-wait", help="Return at once."),
              resource_group: str = RG, output: Output = OutputOpt,
              yes: bool = typer.Option(False, "--yes", "-y", hidden=True)) -> None:
    """Terminate a job: SIGTERM to every rank, a grace period, then SIGKILL.

    A queued job is taken off the queue; a failed one whose nodes are held for `job exec`
    (limits.keep_alive_on_failure) has them released."""
    with handled():
        c = client()
        path, before = locate(c, workspace, experiment, pick_name(name_arg_, name, "job"))
        job = c.post(path + "/terminate")
        if before is not None and before["state"] in TERMINAL:
            held = "nodes held" in (before.get("pending_reason") or "")  # keep_alive_on_failure
            emit(job, output, lambda j: console.print(
                f"job {j['name']} had already ended ({j['state']}); " + (
                    "its nodes held for job exec are released" if held
                    else "nothing to terminate"), highlight=False, markup=False))
            return
        if not no_wait:
            job = watch(c, path, job, lambda j: j["state"] in TERMINAL)

        def render(j: dict[str, Any]) -> None:
            if j["state"] in TERMINAL:
                text = final_line(j)
            else:
                text = f"job {j['name']}: termination requested; it is {describe(j)}"
            console.print(text, highlight=False, markup=False, soft_wrap=True)

        emit(job, output, render)


@app.command("delete")
def delete(name_arg_: str = name_arg("job"), name: str = JobNameOpt,
           workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
           resource_group: str = RG, output: Output = OutputOpt,
           yes: bool = typer.Option(False, "--yes", "-y", hidden=True)) -> None:
    """Delete a finished job and its files."""
    with handled():
        c = client()
        job_name = pick_name(name_arg_, name, "job")
        path, _ = locate(c, workspace, experiment, job_name)
        c.delete(path)
        emit({"deleted": job_name}, output,
             lambda d: console.print(f"job {job_name} deleted", highlight=False))


from batchyard.cli import job_files  # noqa: E402,F401  (job file ..., job metrics)
from batchyard.cli.exec import EXEC_HELP, exec_command  # noqa: E402  (job exec: cli/exec.py)

app.command("exec", help=EXEC_HELP, context_settings={"allow_extra_args": True,
                                                       "ignore_unknown_options": True})(
    exec_command)

from batchyard.cli.stacks import stacks  # noqa: E402  (job stacks: cli/stacks.py)

app.command("stacks")(stacks)

from batchyard.cli.job_logs import logs  # noqa: E402  (job logs: cli/job_logs.py)

app.command("logs")(logs)

from batchyard.cli.tensorboard import tensorboard  # noqa: E402  (cli/tensorboard.py)

app.command("tensorboard")(tensorboard)
