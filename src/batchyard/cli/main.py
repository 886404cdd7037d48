"""Entry point of the `batchyard` command. The root (its options and the commands defined
here) is `root`; the other groups and commands live in their own modules (`PARTS`), which are
imported only when the command line runs them (root help lists the groups from `groups`).
``app`` is the whole command tree (every part), as Typer would run it."""

from __future__ import annotations

import gc
import sys

# Garbage collection in the `batchyard` process: start-up makes tens of thousands of objects
# that all live until the process ends (modules, classes, the command tree) and little garbage,
# and the collector's passes over them, with the full one at exit, were ~10 % of `batchyard
# --help`'s time. In the process of the command line (the `batchyard` script, `python -m`, or
# `main()` reading sys.argv) collection waits from this module's import until a command runs
# (`_global`) or the command line ends without one (help, errors), and what exists then is
# frozen (`gc.freeze`: never examined again, as it lives on anyway). `main(argv)` called
# with its arguments, as tests do in their own process, leaves the collector alone.
_gc_paused = False


def _pause_gc() -> None:
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def _resume_gc() -> None:
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.freeze()
        gc.enable()


if __name__ == "__main__" or sys.argv[0].rpartition("/")[2] in ("batchyard", "batchyard.exe"):
    _pause_gc()

import copy  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

import typer  # noqa: E402

from batchyard import __version__  # noqa: E402
from batchyard.cli import common, groups  # noqa: E402

root = typer.Typer(
    name="batchyard",
    help="Clusters and distributed training jobs on machines you own "
    "(the az batchai / AML Compute workflow, self-hosted).",
    epilog=common.EXIT_CODES_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion, --show-completion (and `batchyard completion`)
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
)

# The groups and commands defined in other modules, in the order help lists them (before the
# root's own): (name, module, a group?). A group's app is `groups.<name>`, which its module
# fills with commands when imported; a command is the module's function of that name.
# `cluster`'s module is cluster_quota, which imports cluster_join (which imports cluster and
# adds `cluster join-command` and `cluster join-token`) and adds `cluster quota`.
PARTS: tuple[tuple[str, str, bool], ...] = (
    ("server", "batchyard.cli.server_cmd", True),
    ("portal", "batchyard.cli.server_cmd", False),
    ("agent", "batchyard.cli.agent", False),
    ("workspace", "batchyard.cli.workspace", True),
    ("cluster", "batchyard.cli.cluster_quota", True),
    ("experiment", "batchyard.cli.workspace", True),
    ("job", "batchyard.cli.job", True),
    ("sweep", "batchyard.cli.sweep", True),
    ("datastore", "batchyard.cli.datastore", True),
    ("login", "batchyard.cli.login", False),
    ("logout", "batchyard.cli.login", False),
    ("whoami", "batchyard.cli.login", False),
    ("token", "batchyard.cli.login", True),
    ("user", "batchyard.cli.identity", True),
    ("team", "batchyard.cli.identity", True),
    ("role", "batchyard.cli.identity", True),
    ("audit", "batchyard.cli.audit", True),
    ("usage", "batchyard.cli.chargeback", True),
    ("price", "batchyard.cli.chargeback", True),
    ("budget", "batchyard.cli.chargeback", True),
)


# Root help lists the nouns (workspace, cluster, experiment, job, ...) under "Commands" and
# these, and the root's own commands, under TOOLS_PANEL after them.
TOOLS = frozenset({"server", "portal", "agent", "usage", "price", "budget"})
TOOLS_PANEL = "Server and tools"


def with_parts(only: str | None = None, commands: bool = True) -> typer.Typer:
    """The root with the part named ``only`` (none if no part has that name), or with every
    part (None): a copy of `root` registering them as ``app.add_typer``/``app.command``
    would, in `PARTS`' order. ``commands=False``: the groups as `groups` has them and the
    commands as listed only (`startup.listed_only`), their modules not imported (what root
    help shows of a group or command is its name and help)."""
    view = copy.copy(root)
    view.registered_commands, view.registered_groups = [], []
    for name, module, is_group in PARTS:
        if only is not None and name != only:
            continue
        panel = TOOLS_PANEL if name in TOOLS else None
        if not is_group:
            if commands:
                function = getattr(importlib.import_module(module), name)
            else:
                from batchyard.cli.startup import listed_only

                function = listed_only(name)
            view.command(name, help=groups.COMMAND_HELP[name],
                         rich_help_panel=panel)(function)
            continue
        if commands:
            importlib.import_module(module)
        view.add_typer(getattr(groups, name), name=name, rich_help_panel=panel)
    view.registered_commands += root.registered_commands
    view.registered_groups += root.registered_groups
    return view


@functools.cache
def full_app() -> typer.Typer:
    """Every command (what ``app`` is)."""
    return with_parts(None)


def __getattr__(name: str) -> Any:
    if name == "app":
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"batchyard {__version__}")
        raise typer.Exit(0)


@root.callback()
def _global(
    ca_file: str = typer.Option(None, "--ca-file", envvar="BATCHYARD_CA",
                                help="Trust the server's HTTPS with this CA file."),
    ca_sha256: str = typer.Option(None, "--ca-sha256", envvar="BATCHYARD_CA_SHA256",
                                  help="Or pin the server's CA by its sha256."),
    show_version: bool = typer.Option(False, "--version", "-V", is_eager=True,
                                      callback=_print_version, expose_value=True,
                                      help="Print the version and exit."),
) -> None:
    """Clusters and distributed training jobs on machines you own."""
    import os

    _resume_gc()  # a command runs next
    if ca_file:
        os.environ["BATCHYARD_CA"] = ca_file
    if ca_sha256:
        os.environ["BATCHYARD_CA_SHA256"] = ca_sha256


schema_app = typer.Typer(help="JSON Schemas of the file formats (always JSON: --output does "
                         "not apply).", no_args_is_help=True)
root.add_typer(schema_app, name="schema", rich_help_panel=TOOLS_PANEL)


@schema_app.command("job")
def schema_job() -> None:
    """Print the JSON Schema of the native job YAML (it is JSON already)."""
    import json

    from batchyard.spec.job import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


quota_app = typer.Typer(help="Workspace quotas (admin).", no_args_is_help=True)
root.add_typer(quota_app, name="quota", rich_help_panel=TOOLS_PANEL)


@quota_app.command("set")
def quota_set(family: str = typer.Option(..., "--family", help="e.g. standardNCFamily"),
              vcpus: int = typer.Option(None, "--vcpus", help="vCPU limit (omit: none)."),
              gpus: int = typer.Option(None, "--gpus", help="GPU limit (omit: none)."),
              workspace: str = common.WorkspaceOpt,
              output: common.Output = common.OutputOpt) -> None:
    """Set a workspace's limit for one node family."""
    with common.handled():
        data = common.client().request(
            "PUT", f"/workspaces/{common.ws_name(workspace)}/quotas",
            json={"family": family, "vcpus": vcpus, "gpus": gpus})
        common.emit(data, output, lambda d: common.console.print(
            f"quota for {d['family']}: {quota_text(d['vcpu_limit'], 'vCPU')}, "
            f"{quota_text(d['gpu_limit'], 'GPU')}", highlight=False, markup=False))


def quota_text(limit: int | None, unit: str) -> str:
    """``48 vCPUs``, ``1 GPU``, ``no GPU limit`` (never "None GPUs")."""
    if limit is None:
        return f"no {unit} limit"
    return f"{limit} {unit}" + ("" if limit == 1 else "s")


@root.command("version", rich_help_panel=TOOLS_PANEL)
def version(output: common.Output = common.OutputOpt) -> None:
    """Print the version (of this client; `server status` gives the server's)."""
    common.emit({"version": __version__}, output, lambda d: typer.echo(d["version"]))


SHELLS = ("bash", "zsh", "fish", "powershell")


@root.command("completion", rich_help_panel=TOOLS_PANEL)
def completion(shell: str = typer.Argument(..., metavar="SHELL",
                                           help="bash, zsh, fish or powershell.")) -> None:
    """Print the shell completion script (bash, zsh, fish, powershell).

    E.g. `source <(batchyard completion bash)` in ~/.bashrc, or `batchyard completion fish >
    ~/.config/fish/completions/batchyard.fish`; `batchyard --install-completion` installs it
    for the current shell."""
    if shell not in SHELLS:
        common.fail(f"SHELL {shell!r}: one of {', '.join(SHELLS)}")
    from typer._completion_shared import get_completion_script

    typer.echo(get_completion_script(prog_name="batchyard", complete_var="_BATCHYARD_COMPLETE",
                                     shell=shell))


def _quiet_types() -> None:
    """Help without the `<bool>`/`<str>` type column typer prints by default: nothing for
    flags, TEXT / INTEGER / FLOAT / PATH (as click and sky print them) for values, the
    choices (`table|json`) where there are some."""
    from typer.core import TyperArgument, TyperOption

    plain = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": None, "path": "PATH",
             "file": "PATH", "directory": "PATH", "list[str]": "TEXT", "list[int]": "INTEGER",
             "int range": "INTEGER", "float range": "FLOAT"}

    def display(self: Any, ctx: Any) -> str | None:
        if getattr(self, "metavar", None) is not None and isinstance(self, TyperOption):
            return str(self.metavar)
        if getattr(self, "is_flag", False):
            return None
        label = str(self.display_type(ctx)).strip("<>")
        if "|" in label:
            return label.removeprefix("list[").removesuffix("]")
        if isinstance(self, TyperArgument):
            return None  # NAME says it
        return plain.get(label, label.upper())

    for cls in (TyperOption, TyperArgument):
        if hasattr(cls, "display_type_rich"):
            cls.display_type_rich = display  # type: ignore[method-assign]


def _reflow(command: Any) -> None:
    """Docstrings wrap at 79 columns in the source; help re-wraps each paragraph to the
    terminal instead of keeping the source's line breaks."""
    import inspect

    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(" ".join(line.strip() for line in p.splitlines())
                                   for p in paragraphs)
    for sub in (getattr(command, "commands", None) or {}).values():
        _reflow(sub)


def main(argv: list[str] | None = None) -> None:
    """Run the command line (``argv``: the arguments, default ``sys.argv[1:]``). What
    `cli/quick.py` runs without Typer runs there; otherwise only the command group being
    run is built, values are checked without pydantic where they can be, and help loads
    without rich's markdown and traceback modules (`startup`); without ``argv``, garbage
    collection waits until a command runs (`_pause_gc`), and a help page printed is kept
    for the next time (`helpcache`)."""
    own = argv is None  # this process's command line
    args = sys.argv[1:] if argv is None else list(argv)
    from batchyard.cli import quick

    code = quick.run(args, own=own)
    if code is not None:
        raise SystemExit(code)
    if own:
        _pause_gc()
    try:
        if own:
            from batchyard.cli.helpcache import recording

            with recording(args):
                _main(argv)
        else:
            _main(argv)
    finally:
        if own:
            _resume_gc()


def _main(argv: list[str] | None) -> None:
    from batchyard.cli import startup

    startup.quick_values()
    startup.defer_rich_help_extras()
    _quiet_types()
    args = sys.argv[1:] if argv is None else argv
    name = startup.command_name(args)
    if os.environ.get(startup.COMPLETE_VAR):  # completion walks the whole tree
        from typer.main import get_command

        command = get_command(full_app())
    else:  # a name that is no command: every part, for the error's suggestions
        known = name in startup.names(root) or any(name == p[0] for p in PARTS)
        # unknown or none: root help, --version or an error, which show every group shallow
        view = with_parts(name) if known else with_parts(None, commands=False)
        command = startup.command_for(view, args)
    _reflow(command)  # what `app()` runs, polished first
    command(argv, prog_name="batchyard")


if __name__ == "__main__":
    main()
