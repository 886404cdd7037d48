"""The `batchyard` command's entry point, and the quick path of what scripts run most, with
neither Typer, Rich, pydantic nor httpx (issue 37: a `job create` cost ~30x Python's own
start, almost all of it imports, so 16 parallel submits made 1-2 a second):

* a help page kept from an earlier run (cli/helpcache.py);
* ``--version``, ``-V`` and ``version [-o json|table]``;
* ``job create -f FILE`` of a native job file (and ``--what-if -o json`` of one), with
  ``-n -c -w -e -o`` (and the hidden
  ``-g``/``--storage-account-name``) and the root's ``--ca-file``/``--ca-sha256``. The file's
  document goes to the server as written (relative local paths made absolute, as the loader
  does) and the server validates it as it validates every submit; only when it is refused
  (a 4xx: a bad field, an unknown cluster, a name taken) does the whole CLI run the command
  again, from the start, as it always did (loading and validating the file locally first),
  so every error is said exactly as before. Nothing was made by a refused submit.

Anything else - another command or format, any other option or form (``-fjob.yaml``,
``--``), a value starting with '-', completion, a server that must be started first - returns
None from `run`, and the whole CLI (cli/main.py) runs the command line as it always did.
`tests/unit/cli/test_cli_quick.py` checks that what this path takes is what Typer would
take."""

from __future__ import annotations

import os
import sys

from batchyard.cli import out

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ROOT_VALUES = {"--ca-file": "BATCHYARD_CA", "--ca-sha256": "BATCHYARD_CA_SHA256"}
CREATE_VALUES = {
    "-f": "file", "--config-file": "file", "-n": "name", "--name": "name",
    "-c": "cluster", "--cluster": "cluster", "-w": "workspace", "--workspace": "workspace",
    "-e": "experiment", "--experiment": "experiment", "-o": "output", "--output": "output",
    "-g": "resource_group", "--resource-group": "resource_group",
    "--storage-account-name": "storage_account_name",
}
OUTPUTS = ("table", "json")
MAX_DOCUMENT = 64 * 1024  # bytes of JSON sent as written (no field can reach an OS limit)


def main() -> None:
    """The `batchyard` script: the quick path, else the whole CLI."""
    code = run(sys.argv[1:], own=True)
    if code is None:
        from batchyard.cli.main import main as whole

        whole()
        return
    sys.exit(code)


def run(args: list[str], *, own: bool = False) -> int | None:
    """The exit code of ``args`` run here, or None: the whole CLI runs them. ``own``: this
    process's command line (a kept help page is written to the real stdout)."""
    if os.environ.get("_BATCHYARD_COMPLETE"):
        return None
    if own:
        from batchyard.cli import helpcache

        if helpcache.wanted(args):
            return 0 if helpcache.replay(args) else None
    if args in (["--version"], ["-V"]):
        return _version(None)
    if args and args[0] == "version":
        return _version(args[1:])
    env: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("--ca-"):
        name, eq, value = args[i].partition("=")
        if name not in ROOT_VALUES:
            return None
        if not eq:
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            i += 1
        if value.startswith("-"):
            return None
        env[ROOT_VALUES[name]] = value
        i += 1
    if args[i:i + 2] != ["job", "create"]:
        return None
    rest = args[i + 2:]
    what_if = rest.count("--what-if")
    options = parse_create([w for w in rest if w != "--what-if"])
    if options is None or what_if > 1:
        return None
    if what_if:  # answered as JSON here; words need Rich: the whole CLI
        if options.get("output") != "json":
            return None
        options["what_if"] = True
    for name, value in env.items():  # as the root's callback does
        if value:
            os.environ[name] = value
    return job_create(options)


def _version(rest: list[str] | None) -> int | None:
    import batchyard

    if rest is None:
        sys.stdout.write(f"batchyard {batchyard.__version__}\n")
        return 0
    output = "table"
    if rest:
        if len(rest) != 2 or rest[0] not in ("-o", "--output") or rest[1] not in OUTPUTS:
            return None
        output = rest[1]
    def show(data: dict[str, str]) -> None:
        sys.stdout.write(f"{data['version']}\n")

    out.emit({"version": batchyard.__version__}, output, show)
    return 0


def parse_create(args: list[str]) -> dict[str, Any] | None:
    """`job create`'s options as Typer would take them (their last value), when every word
    is one the quick path takes; else None."""
    found: dict[str, Any] = {}
    i = 0
    while i < len(args):
        word = args[i]
        name, eq, value = word.partition("=")
        if eq and name.startswith("--") and name in CREATE_VALUES:
            i += 1
        elif word in CREATE_VALUES and i + 1 < len(args):
            name, value = word, args[i + 1]
            i += 2
        else:
            return None
        if value.startswith("-") or "\0" in value:
            return None
        found[CREATE_VALUES[name]] = value
    if "workspace" not in found and os.environ.get("BATCHYARD_WORKSPACE"):
        found["workspace"] = os.environ["BATCHYARD_WORKSPACE"]
    for key in ("workspace", "experiment"):  # common.path_safe refuses these: Typer says so
        given = found.get(key)
        if given is not None and ("/" in given or given in (".", "..")):
            return None
    if not found.get("file") or found.get("output", "table") not in OUTPUTS:
        return None
    return found


def _relative_local(path: str) -> bool:
    """spec.loader's `_is_relative_local`."""
    return bool(path) and not (os.path.isabs(path) or path.startswith(("$", "~", "azureml:"))
                               or "://" in path)


def document_body(file: str) -> dict[str, Any] | None:
    """The native job in ``file`` as the server takes it (relative local paths absolute, as
    `spec.loader` makes them), or None where the quick path leaves the file to the loader: a
    syntax error, another format, a sweep or array, inputs or mounts, a large document."""
    import json

    from batchyard import errors
    from batchyard.spec.documents import detect_job_format, is_sweep_document, read_document

    if not os.path.isfile(file):
        return None
    try:
        document = read_document(file)
    except errors.BatchyardError:
        return None
    if not isinstance(document, dict) or is_sweep_document(document) or \
            detect_job_format(document) != "native":
        return None
    if document.get("inputs") or document.get("mounts") or document.get("array") is not None:
        return None
    code = document.get("code")
    if code is not None and not isinstance(code, str):
        return None
    if not _plain_json(document):  # dates, numbers as keys, NaN: the loader says what
        return None                # they are, as it always did
    if len(json.dumps(document)) > MAX_DOCUMENT:
        return None
    body = dict(document)
    if code and _relative_local(code):
        body["code"] = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(file)),
                                                     code))
    return body


def _plain_json(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is JSON as it is: text keys, finite numbers, nothing YAML adds."""
    if depth > 64:
        return False
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_plain_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_json(v, depth + 1) for k, v in value.items())
    return False


def job_create(options: dict[str, Any]) -> int | None:
    """`job create -f FILE` (see the module's doc)."""
    from batchyard import errors

    body = document_body(options["file"])
    if body is None:
        return None
    workspace = options.get("workspace") or "default"
    try:
        c = _running_client()
        if c is None:
            return None
        if options.get("what_if"):  # nothing runs: no code to pack
            body.pop("code", None)
            out.emit(c.post(f"/workspaces/{workspace}/jobs/what-if", {
                "spec": body, "experiment": options.get("experiment"),
                "cluster": options.get("cluster"), "name": options.get("name"),
                "source_format": "native"}), "json")
            return 0
        code = body.get("code")
        if code and not code.startswith("snapshot:"):
            from batchyard.snapshot import pack

            body["code"] = f"snapshot:{c.upload_snapshot(pack(code))}"
        payload = {"spec": body, "experiment": options.get("experiment"),
                   "cluster": options.get("cluster"), "name": options.get("name"),
                   "source_format": "native", "dry_run": False}
        result = c.submit(f"/workspaces/{workspace}/jobs", payload)
    except errors.BatchyardError as exc:
        if 400 <= exc.http_status < 500 and not isinstance(exc, errors.ServerUnavailable):
            return None  # refused: said as the whole CLI says it (see the module's doc)
        out.error_line(out.escape(exc.message))
        return out.exit_code_of(exc)
    except KeyboardInterrupt:
        out.say("interrupted", err=True)
        return out.EXIT_INTERRUPTED
    for warning in result.get("warnings") or ():  # a team's budget spent: as job_create says
        out.say(f"warning: {warning}", err=True)
    out.emit(result, options.get("output", "table"), _submitted)
    return 0


def _running_client() -> Any:
    """`out.client()` when a server answers (or is expected to) without starting one: a
    server started here is announced by the whole CLI, as always."""
    from batchyard import errors

    if out._client is None:
        from batchyard.client.http import Client

        try:
            out._client = Client.connect(autostart=False, quiet=True)
        except errors.ServerUnavailable:
            return None
    return out._client


def _submitted(d: dict[str, Any]) -> None:
    if "jobs" in d:  # a job array (the server made one): as job_create prints it
        from batchyard.cli.arrays import submitted_line

        out.say(submitted_line(d))
        return
    reason = f" ({d['pending_reason']})" if d.get("pending_reason") else ""
    tail = (f" submitted to cluster {d['cluster']} (experiment {d['experiment']}): "
            f"{d['state']}{reason}")
    if not out.plain(f"job {d['name']}{tail}"):
        out.console.print(f"job [bold]{d['name']}[/]{tail}", highlight=False, soft_wrap=True)
