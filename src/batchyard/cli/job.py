"""`batchyard job` (create/list/show/logs/wait/terminate/delete, file list/download)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from batchyard.cli.common import (
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
    is_tty,
    key_values,
    table,
    ws_name,
)
from batchyard.states import JOB_TERMINAL

if TYPE_CHECKING:
    from batchyard.client.http import Client


def format_duration(seconds: float | None) -> str:
    """``spec.durations.format_duration``, imported when first needed (start-up)."""
    from batchyard.spec.durations import format_duration as fmt

    return fmt(seconds)


app = typer.Typer(help="Jobs: gangs of processes running one command.", no_args_is_help=True)
file_app = typer.Typer(help="A job's files: logs and outputs.", no_args_is_help=True)
app.add_typer(file_app, name="file")

TERMINAL = JOB_TERMINAL
COLUMNS = [("name", "Name"), ("experiment", "Experiment"), ("cluster", "Cluster"),
           ("state", "State"), ("nodes_x", "Nodes x Procs"), ("dur", "Duration"),
           ("exit_code", "Exit"), ("why", "Pending reason / message")]
RG = typer.Option(None, "--resource-group", "-g", hidden=True)


def job_exit_code(job: dict[str, Any]) -> int:
    """`job wait` exits as the job did: its exit code, 1 if it failed without one, 130 if it
    was canceled."""
    if job["state"] == "succeeded":
        return 0
    if job["state"] == "canceled":
        return 130
    code = job.get("exit_code")
    return int(code) if code not in (None, 0) else 1


def _row(j: dict[str, Any]) -> dict[str, Any]:
    return {**j, "nodes_x": f"{j['nodes']} x {j['processes_per_node']}",
            "dur": format_duration(j.get("duration")) if j.get("duration") else "-",
            "why": j.get("pending_reason") or j.get("message")}


def _render_show(j: dict[str, Any]) -> None:
    key_values(_row(j), ["name", "experiment", "cluster", "state", "pending_reason", "message",
                         "exit_code", "priority", "nodes_x", "distribution", "attempt", "dur",
                         "assigned_nodes", "source_format", "metrics"])
    if j.get("attempts"):
        table([{**a, "took": format_duration((a["ended_at"] or time.time()) -
                                             (a["started_at"] or a["created_at"]))}
               for a in j["attempts"]],
              [("number", "Attempt"), ("state", "State"), ("exit_code", "Exit"),
               ("took", "Took"), ("message", "Message"), ("uuid", "Id")], title="Attempts")


def _path(workspace: str | None, experiment: str | None, name: str) -> str:
    from batchyard.client.http import Client

    return Client.job_path(ws_name(workspace), exp_name(experiment), name)


@app.command("create")
def create(
    file: Path = typer.Option(..., "--config-file", "-f", exists=False,
                              help="Job file: native YAML, Batch AI job.json or AML v2 YAML."),
    name: str = typer.Option(None, "--name", "-n", help="Job name (default: from the file)."),
    cluster: str = typer.Option(None, "--cluster", "-c", help="Cluster to run on."),
    workspace: str = WorkspaceOpt,
    experiment: str = ExperimentOpt,
    ignore: list[str] = typer.Option([], "--ignore", help="A property that cannot be honoured "
                                     "here, dropped on purpose (e.g. containerSettings)."),
    wait: bool = typer.Option(False, "--wait", help="Stream the logs until the job ends."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Validate and show what would run on each node."),
    storage_account_name: str = typer.Option(None, "--storage-account-name", hidden=True),
    resource_group: str = RG,
    output: Output = OutputOpt,
) -> None:
    """Submit a job."""
    with handled():
        from batchyard.snapshot import pack
        from batchyard.spec.loader import detect_job_format, load_job_file, read_document

        if not file.is_file():
            fail(f"--config-file: {file} does not exist")
        spec = load_job_file(file, ignore=set(ignore))
        source_format = detect_job_format(read_document(file))
        body = spec.model_dump(mode="json", exclude_none=True)
        c = client()
        if spec.code and not spec.code.startswith("snapshot:"):
            data = pack(spec.code)
            body["code"] = f"snapshot:{c.upload_snapshot(data)}"
        payload = {"spec": body, "experiment": experiment, "cluster": cluster, "name": name,
                   "source_format": source_format, "dry_run": dry_run}
        result = c.post(f"/workspaces/{ws_name(workspace)}/jobs", payload)
        if dry_run:
            emit(result, output, lambda d: print(d["plan"]))
            return
        if not wait:
            emit(result, output, lambda d: console.print(
                f"job [bold]{d['name']}[/] submitted to cluster {d['cluster']} "
                f"(experiment {d['experiment']}): {d['state']}"))
            return
        if output == Output.table:
            err_console.print(f"job [bold]{result['name']}[/] submitted to cluster "
                              f"{result['cluster']}; streaming logs (Ctrl-C stops following, "
                              "the job keeps running)")
        path = c.job_path(ws_name(workspace), result["experiment"], result["name"])
        final = _follow_then_wait(c, path, output)
        raise typer.Exit(job_exit_code(final))


def _follow_then_wait(c: Client, path: str, output: Output) -> dict[str, Any]:
    out = sys.stdout.buffer if output == Output.table else sys.stderr.buffer
    for chunk in c.stream(path + "/logs", follow=True):
        out.write(chunk)
        out.flush()
    job = _wait(c, path, quiet=True)
    emit(job, output, _render_result)
    return job


def _render_result(j: dict[str, Any]) -> None:
    colour = {"succeeded": "green", "failed": "red"}.get(j["state"], "yellow")
    took = format_duration(j.get("duration")) if j.get("duration") else "-"
    console.print(f"job [bold]{j['name']}[/] [{colour}]{j['state']}[/] in {took}"
                  + (f": {j['message']}" if j.get("message") else ""), highlight=False)


def _wait(c: Client, path: str, quiet: bool = False, timeout: float | None = None
          ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout if timeout else None
    job: dict[str, Any] = c.get(path)
    if quiet or not is_tty():
        while job["state"] not in TERMINAL:
            if deadline and time.monotonic() > deadline:
                break
            time.sleep(0.3)
            job = c.get(path)
        return job
    with console.status("") as status:
        while job["state"] not in TERMINAL:
            if deadline and time.monotonic() > deadline:
                break
            why = job.get("pending_reason") or ""
            status.update(f"job {job['name']}: {job['state']} {why}")
            time.sleep(0.3)
            job = c.get(path)
    return job


@app.command("wait")
def wait_(name: str = typer.Option(..., "--name", "-n"), workspace: str = WorkspaceOpt,
          experiment: str = ExperimentOpt,
          timeout: float = typer.Option(None, "--timeout", help="Give up after this many s."),
          resource_group: str = RG, output: Output = OutputOpt) -> None:
    """Wait for a job to end; exit with its exit code."""
    with handled():
        job = _wait(client(), _path(workspace, experiment, name), timeout=timeout)
        emit(job, output, _render_result)
        if job["state"] not in TERMINAL:
            fail(f"job {name} still {job['state']} after {timeout:g}s", 1)
        raise typer.Exit(job_exit_code(job))


@app.command("list")
def list_(workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
          state: str = typer.Option(None, "--state", help="Only jobs in this state."),
          cluster: str = typer.Option(None, "--cluster", "-c"),
          limit: int = typer.Option(100, "--limit", help="Show the newest N jobs."),
          every: bool = typer.Option(False, "--all", help="Every job, fetched page by page "
                                     "(JSON is written as the pages come)."),
          resource_group: str = RG, output: Output = OutputOpt) -> None:
    """List jobs, newest first (all experiments unless -e is given)."""
    with handled():
        if limit < 1:
            fail("--limit: 1 or more")
        c = client()
        path = f"/workspaces/{ws_name(workspace)}/jobs"
        where = {"experiment": experiment, "state": state, "cluster": cluster}
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
            table([_row(j) for j in rows], COLUMNS)
            return
        rows, cursor = [], None
        while len(rows) < limit:
            page, cursor = c.page(path, limit=min(1000, limit - len(rows)), cursor=cursor,
                                  **where)
            rows += page
            if not cursor:
                break
        emit(rows, output, lambda d: table([_row(j) for j in d], COLUMNS))
        if cursor and output == Output.table:
            err_console.print(f"(the newest {len(rows)} jobs; --limit N or --all for more)",
                              highlight=False)


@app.command("show")
def show(name: str = typer.Option(..., "--name", "-n"), workspace: str = WorkspaceOpt,
         experiment: str = ExperimentOpt, resource_group: str = RG,
         output: Output = OutputOpt) -> None:
    """Show a job: state, pending reason, attempts, latest metrics (secrets redacted)."""
    with handled():
        path = _path(workspace, experiment, name)
        job = client().get(path)
        if output == Output.table:  # the latest value of each metric (all: `job metrics`)
            from batchyard.sdk.metrics import decode

            rows = client().get(path + "/metrics")
            if rows:
                job["metrics"] = {r["name"]: decode(r["value"]) for r in rows}
        emit(job, output, _render_show)


@app.command("logs")
def logs(name: str = typer.Option(..., "--name", "-n"), workspace: str = WorkspaceOpt,
         experiment: str = ExperimentOpt,
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming."),
         node: str = typer.Option(None, "--node", help="Node name or node rank."),
         rank: int = typer.Option(None, "--rank", help="Global rank."),
         stream: str = typer.Option("all", "--stream", help="stdout, stderr or all."),
         attempt: int = typer.Option(None, "--attempt", help="Attempt number (default last)."),
         resource_group: str = RG) -> None:
    """Print (or follow) the ranks' logs, each line prefixed with node/rank."""
    with handled():
        out = sys.stdout.buffer
        for chunk in client().stream(_path(workspace, experiment, name) + "/logs",
                                     follow=follow, node=node, rank=rank, stream=stream,
                                     attempt=attempt):
            out.write(chunk)
            out.flush()


@app.command("terminate")
def terminate(name: str = typer.Option(..., "--name", "-n"), workspace: str = WorkspaceOpt,
              experiment: str = ExperimentOpt,
              no_wait: bool = typer.Option(False, "--no-wait", help="Return at once."),
              resource_group: str = RG, output: Output = OutputOpt,
              yes: bool = typer.Option(False, "--yes", "-y", hidden=True)) -> None:
    """Terminate a job: SIGTERM to every rank, a grace period, then SIGKILL."""
    with handled():
        c = client()
        path = _path(workspace, experiment, name)
        job = c.post(path + "/terminate")
        if not no_wait:
            job = _wait(c, path)
        emit(job, output, _render_result)


@app.command("delete")
def delete(name: str = typer.Option(..., "--name", "-n"), workspace: str = WorkspaceOpt,
           experiment: str = ExperimentOpt, resource_group: str = RG,
           output: Output = OutputOpt,
           yes: bool = typer.Option(False, "--yes", "-y", hidden=True)) -> None:
    """Delete a finished job and its files."""
    with handled():
        client().delete(_path(workspace, experiment, name))
        emit({"deleted": name}, output, lambda d: console.print(f"job {name} deleted"))


@file_app.command("list")
def file_list(job: str = typer.Option(..., "--job", "-j", "--name", "-n"),
              workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
              attempt: int = typer.Option(None, "--attempt"), resource_group: str = RG,
              output: Output = OutputOpt) -> None:
    """List a job's files (logs under stdouterr/, outputs under outputs/<ID>/)."""
    with handled():
        data = client().get(_path(workspace, experiment, job) + "/files", attempt=attempt)
        emit(data, output, lambda d: table(
            d["files"], [("path", "Path"), ("size", "Bytes")],
            title=f"attempt {d['attempt']}"))


@file_app.command("download")
def file_download(job: str = typer.Option(..., "--job", "-j", "--name", "-n"),
                  path: str = typer.Option(None, "--path", "-p", help="File path as listed; "
                                           "omit to download everything."),
                  dest: Path = typer.Option(Path("."), "--dest", "-d", help="Target dir."),
                  workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
                  attempt: int = typer.Option(None, "--attempt"), resource_group: str = RG,
                  output: Output = OutputOpt) -> None:
    """Download one file, or all of a job's files, keeping their paths."""
    with handled():
        c = client()
        base = _path(workspace, experiment, job)
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
        emit(done, output, lambda d: table(d, [("path", "Path"), ("saved_to", "Saved to"),
                                               ("size", "Bytes")]))


@app.command("metrics")
def metrics(name: str = typer.Option(..., "--name", "-n"), workspace: str = WorkspaceOpt,
            experiment: str = ExperimentOpt,
            metric: str = typer.Option(None, "--metric", "-m", help="Only this metric."),
            every: bool = typer.Option(False, "--all", help="Every value logged, not only "
                                       "the latest of each metric."),
            resource_group: str = RG, output: Output = OutputOpt) -> None:
    """Metrics the job logged (run.log, batchyard.log_metric); JSON gives every value."""
    with handled():
        from batchyard.sdk.metrics import decode

        rows = client().get(_path(workspace, experiment, name) + "/metrics", metric=metric)
        if output == Output.table:
            rows = [{**row, "value": decode(row["value"])} for row in rows]
        if every or output == Output.json:
            emit(rows, output, lambda d: table(d, [("name", "Metric"), ("value", "Value"),
                                                   ("step", "Step"), ("rank", "Rank"),
                                                   ("attempt", "Attempt")]))
            return
        latest: dict[str, dict[str, Any]] = {}
        for row in rows:
            count = latest.get(row["name"], {}).get("count", 0) + 1
            latest[row["name"]] = {**row, "count": count}
        table(list(latest.values()), [("name", "Metric"), ("value", "Latest value"),
                                      ("step", "Step"), ("rank", "Rank"),
                                      ("count", "Values")])
