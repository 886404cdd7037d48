"""`batchyard job` (create/list/show/logs/wait/terminate/delete, file list/download)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from batchyard import errors
from batchyard.cli import groups
from batchyard.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    ExperimentOpt,
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    emit,
    err_console,
    exp_name,
    fail,
    handled,
    human_size,
    human_time,
    key_values,
    name_arg,
    pick_name,
    stderr_is_tty,
    table,
    ws_name,
)
from batchyard.states import JOB_STATES, JOB_TERMINAL

if TYPE_CHECKING:
    from batchyard.client.http import Client


def format_duration(seconds: float | None) -> str:
    """``spec.durations.format_duration``, imported when first needed (start-up)."""
    from batchyard.spec.durations import format_duration as fmt

    return fmt(seconds)


app = groups.job
file_app = typer.Typer(help="A job's files: logs and outputs.", no_args_is_help=True)
app.add_typer(file_app, name="file")

TERMINAL = JOB_TERMINAL
WAITING = ("queued", "preparing")  # before the ranks run: nothing in the logs yet
COLUMNS = [("name", "Name"), ("experiment", "Experiment", "id?"),
           ("cluster", "Cluster", "id?"), ("state", "State"), ("nodes_x", "Nodes", "id?"),
           ("dur", "Duration", "id?"), ("exit_code", "Exit", "num?"),
           ("why", "Reason / message", "text")]
RG = typer.Option(None, "--resource-group", "-g", hidden=True)
JobNameOpt = typer.Option(None, "--name", "-n", help="The job's name (or give it as NAME).")


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
               ("message", "Message"), ("exit_code", "Exit code"), ("priority", "Priority"),
               ("nodes_x", "Nodes x processes"), ("distribution", "Distribution"),
               ("attempt", "Attempt"), ("submitted", "Submitted"), ("dur", "Duration"),
               ("assigned_nodes", "Nodes"), ("source_format", "Job file format"),
               ("metrics", "Latest metrics")]


def _render_show(j: dict[str, Any]) -> None:
    row = _row(j)
    row["submitted"] = human_time(j.get("submitted_at"))
    for key in ("pending_reason", "message", "exit_code", "assigned_nodes", "metrics"):
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
    found = [j for page in c.pages(f"/workspaces/{ws}/jobs", limit=1000) for j in page
             if j["name"] == name]
    if not found:
        raise errors.NotFound(f"job {name!r} not found in workspace {ws!r} (in no experiment)")
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


@app.command("create")
def create(
    file: Path = typer.Option(..., "--config-file", "-f", exists=False,
                              help="Job file: native YAML, Batch AI job.json or AML v2 YAML."),
    name: str = typer.Option(None, "--name", "-n", help="Job name (default: from the file)."),
    cluster: str = typer.Option(None, "--cluster", "-c", help="Cluster to run on."),
    workspace: str = WorkspaceOpt,
    experiment: str = ExperimentOpt,
    sets: list[str] = typer.Option([], "--set", help="Override a field of the loaded job, "
                                   "PATH=VALUE (repeatable; a dotted path, a YAML value), "
                                   "e.g. --set limits.max_wall_clock=2h or --set "
                                   "distribution.type=mpi."),
    env: list[str] = typer.Option([], "--env", help="Set an environment variable of the "
                                  "ranks, KEY=VALUE (repeatable)."),
    nodes: int = typer.Option(None, "--nodes", help="Override the number of nodes."),
    processes_per_node: int = typer.Option(None, "--processes-per-node",
                                           help="Override the ranks per node."),
    priority: str = typer.Option(None, "--priority", help="low, normal or high."),
    tags: list[str] = typer.Option([], "--tag", help="Tag the job, KEY=VALUE (repeatable)."),
    array: str = typer.Option(None, "--array", help="Run it once per index, as sbatch "
                              "--array: 0-99%8 is indices 0-99, at most 8 at once."),
    depends_on: list[str] = typer.Option([], "--depends-on", help="Run after job NAME ends: "
                                         "NAME (it must succeed) or NAME:succeeded|finished|"
                                         "failed (repeatable)."),
    ignore: list[str] = typer.Option([], "--ignore", help="A property that cannot be honoured "
                                     "here, dropped on purpose (e.g. "
                                     "secrets[0].keyVaultSecretReference)."),
    wait: bool = typer.Option(False, "--wait", help="Show its state until it runs, stream "
                              "the logs until it ends, exit with its exit code."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Validate and show what would run on each node."),
    storage_account_name: str = typer.Option(None, "--storage-account-name", hidden=True),
    resource_group: str = RG,
    output: Output = OutputOpt,
) -> None:
    """Submit a job (one file, several runs: --set, --env, --nodes ... override it).

    Overrides (--set, --env, --nodes, --processes-per-node, --priority, --tag) apply to the
    loaded file before it is sent; a bad path or value is refused naming it (exit 2)."""
    with handled():
        from batchyard.snapshot import pack
        from batchyard.spec.job import JobSpec
        from batchyard.spec.loader import detect_job_format, load_job_file, read_document

        if not file.is_file():
            fail(f"--config-file: {file} does not exist")
        from batchyard.spec.sweep import is_sweep_document

        if is_sweep_document(read_document(file)):  # as `az ml job create -f sweep.yml`
            from batchyard.cli.sweep import create as create_sweep

            create_sweep(file=file, name=name, cluster=cluster, workspace=workspace,
                         experiment=experiment, wait=wait, output=output)
            return
        if ignore:
            check_ignores(file, ignore)
        spec = load_job_file(file, ignore=set(ignore))
        source_format = detect_job_format(read_document(file))
        body = spec.model_dump(mode="json", exclude_none=True)
        if array is not None or depends_on:
            from batchyard.cli.arrays import with_array_options

            body = with_array_options(body, array, depends_on)
        if sets or env or tags or nodes is not None or processes_per_node is not None \
                or priority is not None or array is not None or depends_on:
            from batchyard.cli import overrides

            body = overrides.apply(body, sets=sets, env=env, tags=tags, nodes=nodes,
                                   processes_per_node=processes_per_node, priority=priority)
            if any(item.partition("=")[0].strip() == "code" for item in sets) and \
                    body.get("code") and not Path(body["code"]).is_absolute() and \
                    "://" not in body["code"] and not body["code"].startswith("snapshot:"):
                body["code"] = str(Path(body["code"]).absolute())  # as the shell means it
            spec = JobSpec.model_validate(body)
            body = spec.model_dump(mode="json", exclude_none=True)
        c = client()
        if spec.code and not spec.code.startswith("snapshot:"):
            data = pack(spec.code)
            body["code"] = f"snapshot:{c.upload_snapshot(data)}"
        payload = {"spec": body, "experiment": experiment, "cluster": cluster, "name": name,
                   "source_format": source_format, "dry_run": dry_run}
        jobs_path = f"/workspaces/{ws_name(workspace)}/jobs"
        result = c.post(jobs_path, payload) if dry_run else c.submit(jobs_path, payload)
        if dry_run:
            emit(result, output, lambda d: print(d["plan"]))
            return
        if "jobs" in result:  # a job array: its jobs are followed with `job list`
            from batchyard.cli.arrays import submitted_line

            emit(result, output, lambda d: console.print(submitted_line(d), highlight=False,
                                                         markup=False, soft_wrap=True))
            return
        if not wait:
            emit(result, output, lambda d: console.print(
                f"job [bold]{d['name']}[/] submitted to cluster {d['cluster']} "
                f"(experiment {d['experiment']}): {d['state']}"
                + (f" ({d['pending_reason']})" if d.get("pending_reason") else ""),
                highlight=False, soft_wrap=True))
            return
        err_console.print(f"job {result['name']} submitted to cluster {result['cluster']} "
                          f"(experiment {result['experiment']}); Ctrl-C stops following, the "
                          "job keeps running", highlight=False, markup=False, soft_wrap=True)
        path = c.job_path(ws_name(workspace), result["experiment"], result["name"])
        final = follow(c, path, result, output)
        raise typer.Exit(job_exit_code(final))


def check_ignores(file: Path, ignore: list[str]) -> None:
    """Every --ignore must name something the file has that batchyard refuses (or a property
    above it); else exit 2 naming what may be ignored."""
    from batchyard.spec.loader import load_job_file

    refusable = refused_properties(lambda dropped: load_job_file(file, ignore=dropped))
    _check_ignores(file.name, ignore, refusable)


def refused_properties(load: Callable[[set[str]], Any]) -> list[str]:
    """The properties ``load`` refuses (an Unsupported each), found by dropping them in
    turn. Other errors in the file are not this function's business: they surface later."""
    found: list[str] = []
    while True:
        try:
            load(set(found))
            return found
        except errors.Unsupported as exc:
            field = ((exc.details or [{}])[0] or {}).get("field")
            if not field or field in found:
                return found
            found.append(str(field))
        except errors.BatchyardError:
            return found


def _check_ignores(source: str, ignore: list[str], refusable: list[str]) -> None:
    for item in ignore:
        wanted = item.removeprefix("properties.")
        if any(f == wanted or f.startswith((wanted + ".", wanted + "[")) for f in refusable):
            continue
        if refusable:
            fail(f"--ignore {item}: {source} has no such refused property; what can be "
                 f"ignored here: {', '.join(refusable)}")
        fail(f"--ignore {item}: nothing in {source} is refused, so there is nothing to ignore "
             "(--ignore drops Batch AI properties batchyard cannot honour, e.g. a Key Vault "
             "secret reference, and only those)")


def follow(c: Client, path: str, job: dict[str, Any], output: Output) -> dict[str, Any]:
    """What `job create --wait` and `job wait --logs` do: the job's state changes and pending
    reason until its ranks run, then every rank's logs until it ends, then its final line
    (or, with -o json, the final job as JSON on stdout, logs on stderr)."""
    out = sys.stdout.buffer if output == Output.table else sys.stderr.buffer
    with _detachable(job, "following"):
        job = watch(c, path, job, lambda j: j["state"] not in WAITING)
        for chunk in c.stream(path + "/logs", follow=True):
            out.write(chunk)
            out.flush()
        final = watch(c, path, c.get(path), lambda j: j["state"] in TERMINAL, quiet=True)
    emit(final, output, lambda j: console.print(final_line(j), highlight=False,
                                                markup=False, soft_wrap=True))
    return final


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
          *, timeout: float | None = None, quiet: bool = False, poll: float = 0.25
          ) -> dict[str, Any]:
    """Poll the job until ``until(job)`` (or ``timeout``), showing its state changes."""
    deadline = time.monotonic() + timeout if timeout else None
    if until(job):
        return job
    if quiet:
        while not until(job) and not (deadline and time.monotonic() > deadline):
            time.sleep(poll)
            job = c.get(path)
        return job
    with _Progress(job["name"]) as progress:
        progress.show(job)
        while not until(job):
            if deadline and time.monotonic() > deadline:
                break
            time.sleep(poll)
            job = c.get(path)
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
def list_(workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
          state: str = typer.Option(None, "--state", help="Only jobs in this state: "
                                    + ", ".join(JOB_STATES) + "."),
          cluster: str = typer.Option(None, "--cluster", "-c", help="Only jobs of this "
                                      "cluster."),
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
        c = client()
        path = f"/workspaces/{ws_name(workspace)}/jobs"
        where = {"experiment": experiment, "state": state, "cluster": cluster}
        empty = "no jobs" + "".join(f", {k} {v}" for k, v in where.items() if v) + \
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


@app.command("logs")
def logs(name_arg_: str = name_arg("job"), name: str = JobNameOpt,
         workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
         follow_: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the "
                                      "job ends, then print its final line (on stderr)."),
         node: str = typer.Option(None, "--node", help="Node name or node rank."),
         rank: int = typer.Option(None, "--rank", help="Global rank."),
         stream: str = typer.Option("all", "--stream", help="stdout, stderr or all."),
         attempt: int = typer.Option(None, "--attempt", help="Attempt number (default last)."),
         exit_code: bool = typer.Option(False, "--exit-code", help="Exit with the job's exit "
                                        "code, as `job wait` does (a job that has not ended: "
                                        "1, unless -f waits for it)."),
         resource_group: str = RG) -> None:
    """Print (or follow) the ranks' logs, each line prefixed with node/rank.

    Logs are text (no --output json): `job file list -o json` lists the log files."""
    with handled():
        if stream not in ("stdout", "stderr", "all"):
            fail(f"--stream {stream!r}: one of stdout, stderr, all")
        c = client()
        job_name = pick_name(name_arg_, name, "job")
        path, job = locate(c, workspace, experiment, job_name)
        if follow_ or exit_code:
            job = job if job is not None else c.get(path)
        out = sys.stdout.buffer
        with _detachable(job or {"name": job_name, "experiment": experiment,
                                 "workspace": workspace}, "following"):
            if follow_ and job is not None:
                job = watch(c, path, job, lambda j: j["state"] not in WAITING)
            for chunk in c.stream(path + "/logs", follow=follow_, node=node, rank=rank,
                                  stream=stream, attempt=attempt):
                out.write(chunk)
                out.flush()
            if job is not None and (follow_ or exit_code):
                job = c.get(path)
                if follow_:
                    job = watch(c, path, job, lambda j: j["state"] in TERMINAL, quiet=True)
        if follow_ and job is not None:
            err_console.print(final_line(job), highlight=False, markup=False, soft_wrap=True)
        if exit_code and job is not None:
            raise typer.Exit(job_exit_code(job) if job["state"] in TERMINAL else EXIT_ERROR)


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


JobOpt = typer.Option(None, "--job", "-j", "--name", "-n", help="The job's name (or give it "
                      "as JOB).")


def job_arg() -> Any:
    return typer.Argument(None, metavar="JOB", show_default=False,
                          help="The job's name (or give it with -j/-n).")


@file_app.command("list")
def file_list(job_arg_: str = job_arg(), job: str = JobOpt,
              workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
              attempt: int = typer.Option(None, "--attempt"), resource_group: str = RG,
              output: Output = OutputOpt) -> None:
    """List a job's files (logs under stdouterr/, outputs under outputs/<ID>/)."""
    with handled():
        c = client()
        path, _ = locate(c, workspace, experiment, pick_name(job_arg_, job, "job", "-j"))
        data = c.get(path + "/files", attempt=attempt)
        emit(data, output, lambda d: table(
            [{**f, "human": human_size(f.get("size"))} for f in d["files"]],
            [("path", "Path", "path"), ("human", "Size", "num")],
            title=f"attempt {d['attempt']}", empty=f"no files in attempt {d['attempt']}"))


@file_app.command("download")
def file_download(job_arg_: str = job_arg(), job: str = JobOpt,
                  path: str = typer.Option(None, "--path", "-p", help="File path as listed; "
                                           "omit to download everything."),
                  dest: Path = typer.Option(Path("."), "--dest", "-d", help="Target dir."),
                  workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
                  attempt: int = typer.Option(None, "--attempt"), resource_group: str = RG,
                  output: Output = OutputOpt) -> None:
    """Download one file, or all of a job's files, keeping their paths."""
    with handled():
        c = client()
        base, _ = locate(c, workspace, experiment, pick_name(job_arg_, job, "job", "-j"))
        listing = c.get(base + "/files", attempt=attempt)
        wanted = [f for f in listing["files"]
                  if path is None or f["path"] == path or f["path"].startswith(path.rstrip("/")
                                                                               + "/")]
        if not wanted:
            fail(f"--path: no file {path!r} in attempt {listing['attempt']}")
        done = []
        for f in wanted:
            target = dest / f["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            size = c.download(base + "/files/content", str(target), path=f["path"],
                              attempt=listing["attempt"])
            done.append({"path": f["path"], "saved_to": str(target), "size": size})
        emit(done, output, lambda d: table(
            [{**f, "human": human_size(f["size"])} for f in d],
            [("path", "Path", "path"), ("saved_to", "Saved to", "path"),
             ("human", "Size", "num")]))


@app.command("metrics")
def metrics(name_arg_: str = name_arg("job"), name: str = JobNameOpt,
            workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
            metric: str = typer.Option(None, "--metric", "-m", help="Only this metric."),
            every: bool = typer.Option(False, "--all", help="Every value logged, not only "
                                       "the latest of each metric."),
            resource_group: str = RG, output: Output = OutputOpt) -> None:
    """Metrics the job logged (run.log, batchyard.log_metric); JSON gives every value."""
    with handled():
        from batchyard.sdk.metrics import decode

        c = client()
        path, _ = locate(c, workspace, experiment, pick_name(name_arg_, name, "job"))
        rows = c.get(path + "/metrics", metric=metric)
        if output == Output.table:
            rows = [{**row, "value": decode(row["value"])} for row in rows]
        if every or output == Output.json:
            emit(rows, output, lambda d: table(d, [("name", "Metric"), ("value", "Value"),
                                                   ("step", "Step", "num"),
                                                   ("rank", "Rank", "num"),
                                                   ("attempt", "Attempt", "num")],
                                               empty="no metrics"))
            return
        latest: dict[str, dict[str, Any]] = {}
        for row in rows:
            count = latest.get(row["name"], {}).get("count", 0) + 1
            latest[row["name"]] = {**row, "count": count}
        table(list(latest.values()), [("name", "Metric"), ("value", "Latest value"),
                                      ("step", "Step", "num"), ("rank", "Rank", "num"),
                                      ("count", "Values", "num")], empty="no metrics")


from batchyard.cli.exec import EXEC_HELP, exec_command  # noqa: E402  (job exec: cli/exec.py)

app.command("exec", help=EXEC_HELP, context_settings={"allow_extra_args": True,
                                                       "ignore_unknown_options": True})(
    exec_command)

from batchyard.cli.stacks import stacks  # noqa: E402  (job stacks: cli/stacks.py)

app.command("stacks")(stacks)

from batchyard.cli.tensorboard import tensorboard  # noqa: E402  (cli/tensorboard.py)

app.command("tensorboard")(tensorboard)
