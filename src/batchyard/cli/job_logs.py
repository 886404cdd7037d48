"""`batchyard job logs [-f]`, and the following that `job create --wait` and `job wait --logs`
do: a job's lines as they come, across a server that goes away for a moment.

A follower reconnects (client/follow.py: a broken stream, a refused connection, a 502-504) and
goes on after the last line it printed, so each line is printed once; the polls of the job's
state wait the same way. A job that has not started has no lines yet: `job logs` says that it
is queued and why (its pending reason) instead of "not found", and `-f` waits for its lines."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import typer

from batchyard import errors
from batchyard.cli.common import (
    EXIT_ERROR,
    ExperimentOpt,
    Output,
    WorkspaceOpt,
    client,
    console,
    emit,
    err_console,
    fail,
    handled,
    name_arg,
    pick_name,
)

if TYPE_CHECKING:
    from batchyard.client.http import Client

PATIENCE = 300.0  # s a follower waits for a server that went away before it gives up
RG = typer.Option(None, "--resource-group", "-g", hidden=True)  # as cli/job.py's
JobNameOpt = typer.Option(None, "--name", "-n", help="The job's name (or give it as NAME).")


def patient_get(c: Client, path: str, patience: float = PATIENCE) -> Any:
    """``c.get(path)``, tried again while the server cannot answer (restarting, its
    database coming back: 502-504, or no connection) for up to ``patience`` seconds."""
    start = time.monotonic()
    delay = 0.2
    while True:
        try:
            return c.get(path)
        except errors.BatchyardError as exc:
            retry = isinstance(exc, errors.ServerUnavailable) or exc.http_status in (502, 503,
                                                                                     504)
            if not retry or time.monotonic() - start > patience:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 5.0)
        c.follow_home()


def print_logs(c: Client, path: str, out: Any, **params: Any) -> None:
    """Every line of the job's logs until it has ended, each once, reconnecting as needed
    (said once on stderr)."""
    from batchyard.client.follow import follow_logs

    told: list[str] = []

    def retrying(why: str) -> None:
        if not told:
            err_console.print(f"(the log stream broke: {why}; reconnecting, no line is lost)",
                              highlight=False, markup=False, soft_wrap=True)
        told.append(why)

    for chunk in follow_logs(c, path, on_retry=retrying, **params):
        out.write(chunk)
        out.flush()


def follow(c: Client, path: str, job: dict[str, Any], output: Output) -> dict[str, Any]:
    """What `job create --wait` and `job wait --logs` do: the job's state changes and pending
    reason until its ranks run, then every rank's logs until it ends, then its final line
    (or, with -o json, the final job as JSON on stdout, logs on stderr)."""
    from batchyard.cli.job import TERMINAL, WAITING, _detachable, final_line, watch

    out = sys.stdout.buffer if output == Output.table else sys.stderr.buffer
    with _detachable(job, "following"):
        job = watch(c, path, job, lambda j: j["state"] not in WAITING,
                    get=lambda p: patient_get(c, p))
        print_logs(c, path, out)
        final = watch(c, path, patient_get(c, path), lambda j: j["state"] in TERMINAL,
                      quiet=True, get=lambda p: patient_get(c, p))
    emit(final, output, lambda j: console.print(final_line(j), highlight=False,
                                                markup=False, soft_wrap=True))
    return final


def not_started(job: dict[str, Any]) -> str:
    """What `job logs` says of a job with no lines yet: its state and why it waits."""
    why = job.get("pending_reason")
    return (f"job {job['name']} is {job['state']}" + (f": {why}" if why else "")
            + "; it has no log lines yet (`batchyard job logs -f` waits for them)")


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

    Logs are text (no --output json): `job file list -o json` lists the log files. A job
    that has not started yet has none: it says so, and why it waits; -f waits for them."""
    from batchyard.cli.job import (
        TERMINAL,
        WAITING,
        _detachable,
        final_line,
        job_exit_code,
        locate,
        watch,
    )

    with handled():
        if stream not in ("stdout", "stderr", "all"):
            fail(f"--stream {stream!r}: one of stdout, stderr, all")
        c = client()
        job_name = pick_name(name_arg_, name, "job")
        path, job = locate(c, workspace, experiment, job_name)
        if follow_ or exit_code:
            job = job if job is not None else c.get(path)
        out = sys.stdout.buffer
        params = {"node": node, "rank": rank, "stream": stream, "attempt": attempt}
        with _detachable(job or {"name": job_name, "experiment": experiment,
                                 "workspace": workspace}, "following"):
            if follow_ and job is not None:
                job = watch(c, path, job, lambda j: j["state"] not in WAITING,
                            get=lambda p: patient_get(c, p))
                print_logs(c, path, out, **params)
                job = watch(c, path, patient_get(c, path), lambda j: j["state"] in TERMINAL,
                            quiet=True, get=lambda p: patient_get(c, p))
            else:
                try:
                    for chunk in c.stream(path + "/logs", **params):
                        out.write(chunk)
                        out.flush()
                except errors.NotFound:
                    job = c.get(path)  # (raises if the job itself is missing)
                    if job["state"] not in WAITING or attempt is not None:
                        raise
                    err_console.print(not_started(job), highlight=False, markup=False,
                                      soft_wrap=True)
                if job is not None and exit_code:
                    job = c.get(path)
        if follow_ and job is not None:
            err_console.print(final_line(job), highlight=False, markup=False, soft_wrap=True)
        if exit_code and job is not None:
            raise typer.Exit(job_exit_code(job) if job["state"] in TERMINAL else EXIT_ERROR)
