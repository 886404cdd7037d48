"""Help, version and shell completion of the real entry point, without a server: `-h` as well
as `--help` on every command, no `<bool>`/`<str>` type noise, `--version`, `completion
bash|zsh|fish`, Typer's `--install-completion`, the exit codes in `batchyard --help`, and
`--output json` on every command that prints data (or its help saying why not)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from typing import Any

import pytest

from batchyard import __version__

# Commands that print no data of their own, or text that is not a record (each says so).
NO_OUTPUT_OPTION = {
    ("agent",): "daemon",
    ("completion",): "completion script",
    ("schema", "job"): "JSON already",
    ("job", "logs"): "Logs are text",
    ("job", "exec"): "the command's own output",
    ("cluster", "node", "exec"): None,  # has -o json: checked below like the others
}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BATCHYARD_")}
    base.update({"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}, **(env or {}))
    return subprocess.run([sys.executable, "-m", "batchyard.cli.main", *args], env=base,
                          capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def commands() -> Iterator[tuple[tuple[str, ...], Any]]:
    from typer.main import get_command

    from batchyard.cli.main import app

    def walk(cmd: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        subs = getattr(cmd, "commands", None) or {}
        if not subs:
            yield path, cmd
        for name, sub in subs.items():
            if not getattr(sub, "hidden", False):
                yield from walk(sub, (*path, name))

    yield from walk(get_command(app), ())


ALL = sorted(path for path, _ in commands())


@dataclass
class Invoked:
    exit_code: int
    output: str


@pytest.fixture(scope="module")
def invoke() -> Iterator[Any]:
    """The CLI in this process, polished as `main()` polishes it (faster than a process per
    command)."""
    from typer.main import get_command

    from batchyard.cli import main

    main._quiet_types()
    command = get_command(main.app)
    main._reflow(command)

    def call(*args: str) -> Invoked:
        out = io.StringIO()
        code: Any = 0
        with redirect_stdout(out), redirect_stderr(out):
            try:
                command.main(list(args), prog_name="batchyard")
            except SystemExit as exc:
                code = exc.code
        return Invoked(int(code or 0), out.getvalue())

    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}.items():
            mp.setenv(key, value)
        yield call


def test_every_command_has_short_help_flag(invoke: Any) -> None:
    assert len(ALL) > 40
    for path in [(), ("job",), ("cluster", "node"), *ALL]:
        for flag in ("-h", "--help"):
            result = invoke(*path, flag)
            assert result.exit_code == 0, (path, flag, result.output)
            assert "Usage: batchyard" in result.output, (path, result.output)


def test_help_has_no_type_noise(invoke: Any) -> None:
    for path in [(), *ALL]:
        text = invoke(*path, "-h").output
        for noise in ("<bool>", "<str>", "<int>", "<float>", "<path>", "list[str]", "<table"):
            assert noise not in text, (path, noise, text)
    create = invoke("job", "create", "-h").output
    assert "table|json" in create and "PATH" in create and "INTEGER" in create


def test_every_data_command_has_output_json_or_says_why(invoke: Any) -> None:
    for path, cmd in commands():
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        if "--output" in opts:
            continue
        why = NO_OUTPUT_OPTION.get(path)
        assert path in NO_OUTPUT_OPTION, f"{' '.join(path)} has no --output"
        if why:
            assert why in invoke(*path, "-h").output, path


def test_names_are_positional_too(invoke: Any) -> None:
    for path in [("job", "logs"), ("job", "show"), ("job", "wait"), ("job", "terminate"),
                 ("job", "delete"), ("job", "metrics"), ("cluster", "show"),
                 ("cluster", "delete"), ("cluster", "resize"), ("cluster", "auto-scale"),
                 ("cluster", "diagnose"), ("cluster", "join-command"),
                 ("cluster", "file", "list"), ("cluster", "file", "show"),
                 ("experiment", "show"), ("workspace", "show")]:
        text = invoke(*path, "-h").output
        assert f"Usage: batchyard {' '.join(path)} [OPTIONS] [NAME]" in text, (path, text)
        assert "--name" in text and "-n" in text
    assert "[OPTIONS] [JOB]" in invoke("job", "file", "list", "-h").output
    assert "[OPTIONS] [CLUSTER]" in invoke("cluster", "node", "list", "-h").output


def test_version_flag_and_command() -> None:
    assert run("--version").stdout.strip() == f"batchyard {__version__}"
    assert run("-V").stdout.strip() == f"batchyard {__version__}"
    assert run("version").stdout.strip() == __version__
    assert json.loads(run("version", "-o", "json").stdout) == {"version": __version__}


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(shell: str) -> None:
    result = run("completion", shell)
    assert result.returncode == 0, result.stderr
    assert "_BATCHYARD_COMPLETE" in result.stdout and "batchyard" in result.stdout
    bad = run("completion", "tcsh")
    assert bad.returncode == 2 and "bash, zsh, fish" in bad.stderr


def test_completion_completes_commands() -> None:
    # what the bash script asks the program for when the user presses tab
    result = run(env={"_BATCHYARD_COMPLETE": "complete_bash", "COMP_WORDS": "batchyard jo",
                      "COMP_CWORD": "1"})
    assert "job" in result.stdout.split(), result


def test_root_help_lists_exit_codes_and_completion() -> None:
    text = run("-h").stdout
    assert "--install-completion" in text and "--version" in text
    for needle in ("2 bad input", "3 not found", "4 server unreachable",
                   "exit with the job's own code"):
        assert needle in " ".join(text.split()), text
