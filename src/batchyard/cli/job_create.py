"""`batchyard job create`: submit a job file (-f), or a command given inline after ``--``
with the current folder as its code (as ``sky launch -- CMD`` or ``sbatch --wrap``); the same
overrides (--set, --env, --nodes, ...) apply to both."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

from batchyard import errors
from batchyard.cli import groups
from batchyard.cli.common import (
    ExperimentOpt,
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    cluster_opt,
    console,
    emit,
    err_console,
    fail,
    handled,
    ws_name,
)

app = groups.job
INLINE_EXAMPLE = "batchyard job create -c CLUSTER -- python train.py --lr 0.1"
_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


@app.command("create")
def create(
    command: list[str] = typer.Argument(
        None, metavar="[-- COMMAND [ARG]...]", show_default=False,
        help="Run this command instead of a job file (after --, e.g. -- python train.py "
        "--lr 0.1), with the current folder as the job's code; not with -f."),
    file: Path = typer.Option(None, "--config-file", "-f", exists=False,
                              help="Job file: native YAML, Batch AI job.json or AML v2 YAML."),
    name: str = typer.Option(None, "--name", "-n", help="Job name (default: from the file; "
                             "inline: a generated one)."),
    cluster: str = cluster_opt("Cluster to run on."),
    workspace: str = WorkspaceOpt,
    experiment: str = ExperimentOpt,
    sets: list[str] = typer.Option([], "--set", help="Override a field of the loaded job, "
                                   "PATH=VALUE (repeatable; a dotted path, a YAML value), "
                                   "e.g. --set limits.max_wall_clock=2h or --set "
                                   "distribution.type=mpi."),
    env: list[str] = typer.Option([], "--env", help="Set an environment variable of the "
                                  "ranks, KEY=VALUE (repeatable)."),
    nodes: int = typer.Option(None, "--nodes", help="Override the number of nodes "
                              "(inline: default 1)."),
    processes_per_node: int = typer.Option(None, "--processes-per-node",
                                           help="Override the ranks per node (inline: "
                                           "default 1)."),
    image: str = typer.Option(None, "--image", help="Container image the ranks run in "
                              "(sets environment.image)."),
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
    what_if: bool = typer.Option(False, "--what-if", help="Submit nothing: say when it "
                                 "would start, and whether fewer nodes or another cluster "
                                 "would start it sooner."),
    storage_account_name: str = typer.Option(None, "--storage-account-name", hidden=True),
    resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True),
    output: Output = OutputOpt,
) -> None:
    """Submit a job: a job file (-f), or a command after -- with this folder as its code.

    One file, several runs: the overrides (--set, --env, --nodes, --processes-per-node,
    --image, --priority, --tag) apply to the loaded file before it is sent; a bad path or
    value is refused naming it (exit 2). Inline, e.g. `batchyard job create -c gpu --nodes 2
    --processes-per-node 4 -- python train.py --lr 0.1`, the command runs on every rank
    (pytorch layout: torchrun's variables are set) in a snapshot of the current folder."""
    with handled():
        from batchyard.snapshot import pack
        from batchyard.spec.job import JobSpec

        if command and file is not None:
            fail(f"give a job file (-f {file}) or a command after --, not both")
        if not command and file is None:
            fail(f"give a job file (-f FILE), or a command after --: {INLINE_EXAMPLE}")
        if command:
            if ignore:
                fail("--ignore applies to a job file's refused properties; an inline "
                     "command has none")
            spec = JobSpec.model_validate({"command": shell_line(command),
                                           "code": str(Path.cwd())})
            source_format = "native"
        else:
            loaded = _load(file, ignore)
            if loaded is None:  # a sweep file: submitted as a sweep
                if what_if:
                    fail("--what-if: a sweep file's trials are not estimated; ask for one "
                         "trial's job file instead")
                from batchyard.cli.sweep import create as create_sweep

                create_sweep(file=file, name=name, cluster=cluster, workspace=workspace,
                             experiment=experiment, wait=wait, output=output)
                return
            spec, source_format = loaded
        body = spec.model_dump(mode="json", exclude_none=True)
        if array is not None or depends_on:
            from batchyard.cli.arrays import with_array_options

            body = with_array_options(body, array, depends_on)
        if image is not None:
            body.setdefault("environment", {})["image"] = image
        if sets or env or tags or nodes is not None or processes_per_node is not None \
                or priority is not None or array is not None or depends_on \
                or image is not None:
            from batchyard.cli import overrides

            body = overrides.apply(body, sets=sets, env=env, tags=tags, nodes=nodes,
                                   processes_per_node=processes_per_node, priority=priority)
            if any(item.partition("=")[0].strip() == "code" for item in sets) and \
                    body.get("code") and not Path(body["code"]).is_absolute() and \
                    "://" not in body["code"] and not body["code"].startswith("snapshot:"):
                body["code"] = str(Path(body["code"]).absolute())  # as the shell means it
            spec = JobSpec.model_validate(body)
            body = spec.model_dump(mode="json", exclude_none=True)
        if what_if:
            if dry_run or wait:
                fail(f"--what-if submits nothing: not with {'--dry-run' if dry_run else '--wait'}")
            from batchyard.cli.whatif import ask

            body.pop("code", None)  # nothing runs: no snapshot to pack and upload
            ask(client(), f"/workspaces/{ws_name(workspace)}/jobs",
                {"spec": body, "experiment": experiment, "cluster": cluster, "name": name,
                 "source_format": source_format}, output)
            return
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
        for warning in result.get("warnings") or ():  # a team's budget spent
            err_console.print(f"warning: {warning}", highlight=False, markup=False,
                              soft_wrap=True)
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
        from batchyard.cli.job import job_exit_code
        from batchyard.cli.job_logs import follow

        err_console.print(f"job {result['name']} submitted to cluster {result['cluster']} "
                          f"(experiment {result['experiment']}); Ctrl-C stops following, the "
                          "job keeps running", highlight=False, markup=False, soft_wrap=True)
        path = c.job_path(ws_name(workspace), result["experiment"], result["name"])
        final = follow(c, path, result, output)
        raise typer.Exit(job_exit_code(final))


def _load(file: Path, ignore: list[str]) -> tuple[Any, str] | None:
    """The job file's spec and format; None for a sweep file (`job create -f sweep.yml`, as
    `az ml job create` takes one)."""
    from batchyard.spec.documents import detect_job_format, is_sweep_document, read_document
    from batchyard.spec.loader import load_job_file

    if not file.is_file():
        fail(f"--config-file: {file} does not exist")
    document = read_document(file)
    if is_sweep_document(document):
        return None
    if ignore:
        check_ignores(file, ignore)
    return load_job_file(file, ignore=set(ignore)), detect_job_format(document)


def shell_line(words: Sequence[str]) -> str:
    """An inline command as the shell line a rank runs (``bash -c``). One word is a command
    line already (``-- "python a.py && python b.py"``). Several are the argv the user's shell
    made: each stays one word, and a ``$VAR`` left in one (quoted at the prompt so that it
    was not expanded there) expands on the node, as in a job file."""
    if len(words) == 1:
        return words[0]
    return " ".join(_word(w) for w in words)


def _word(word: str) -> str:
    if _SAFE.fullmatch(word):
        return word
    if "$" in word:  # double quotes: one word, and its variables expand on the node
        return '"' + re.sub(r'(["\\`])', r"\\\1", word) + '"'
    return shlex.quote(word)


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
