"""`batchyard job file list|download` and `batchyard job metrics`: what a job left behind
(logs, outputs) and what it logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from batchyard.cli import complete, groups
from batchyard.cli.common import (
    ExperimentOpt,
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    emit,
    fail,
    handled,
    human_size,
    name_arg,
    pick_name,
    table,
)
from batchyard.cli.job import RG, JobNameOpt, locate

app = groups.job
file_app = typer.Typer(help="A job's files: logs and outputs.", no_args_is_help=True)
app.add_typer(file_app, name="file")


JobOpt = typer.Option(None, "--job", "-j", "--name", "-n", autocompletion=complete.jobs,
                      help="The job's name (or give it as JOB).")


def job_arg() -> Any:
    return typer.Argument(None, metavar="JOB", show_default=False,
                          help="The job's name (or give it with -j/-n).",
                          autocompletion=complete.jobs)


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
