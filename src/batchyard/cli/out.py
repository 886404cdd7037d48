"""What every command prints, and its one HTTP client, without Typer or Rich at import (issue
37: a `job create` spent more on importing Rich's console, to print one line, than on its own
work). `cli/common.py` re-exports all of it for the commands; `cli/quick.py` runs a few
commands with this module alone.

Rich prints a line into a pipe as its plain text (no colours, no wrapping with
``soft_wrap``): `plain` writes that text itself wherever Rich would print exactly it, and
hands everything else to Rich (a terminal, a forced one, a text with what Rich would turn
into something else: markup, an ``:emoji:`` code, a control character)."""

from __future__ import annotations

import os
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from rich.console import Console

    from batchyard import errors
    from batchyard.client.http import Client

# Exit codes of the CLI itself (`batchyard --help` and the README list them). `job wait`,
# `job create --wait` and `job logs -f --exit-code` exit with the *job's* code instead, and
# print the job's final line first (stdout), which no CLI error does (errors: stderr only).
EXIT_ERROR = 1        # the server failed, or a job failed without an exit code of its own
EXIT_BAD_INPUT = 2    # a bad option, value or job file; a conflict (e.g. a busy cluster)
EXIT_NOT_FOUND = 3    # no such workspace, experiment, cluster, job, datastore or file
EXIT_UNREACHABLE = 4  # no server answers (or the local one could not start)
EXIT_FORBIDDEN = 5    # a refused authorisation: the caller's role does not allow it
EXIT_INTERRUPTED = 130
EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 server error; 2 bad input (options, job file, conflicts, a token "
    "that is not valid); 3 not found; 4 server unreachable; 5 not allowed (a role is "
    "missing); 130 interrupted. `job wait`, `job create --wait` "
    "and `job logs -f --exit-code` exit with the job's own code instead, after printing "
    "its final line (`job NAME failed with exit code 2 ...`); CLI errors print only "
    "`error: ...` on stderr."
)


class _LazyConsole:
    """A rich ``Console`` made on first use; ``console.print`` etc. behave as on the real
    one."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            from batchyard.cli.startup import lazy_emoji_codes

            lazy_emoji_codes()  # rich's emoji codes load only for a text that may hold one
            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


console: Console = _LazyConsole()  # type: ignore[assignment]
err_console: Console = _LazyConsole(stderr=True)  # type: ignore[assignment]

# Environment that makes Rich take a pipe for a terminal (or size it): Rich decides then.
RICH_TERMINAL_VARS = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS",
                      "JUPYTER_LINES")
# Rich's emoji code pattern (rich/_emoji_replace.py): a text it matches goes to Rich.
_EMOJI = re.compile(r"(:(\S*?)(?:(?:\-)(emoji|text))?:)")


def _plain_file(target: Any) -> Any:
    """The file ``target`` (a console, lazy or not) writes to when Rich would print a plain
    text there as it is (a pipe, a file; no colours, nothing recorded); else None."""
    if isinstance(target, _LazyConsole) and target._console is None:
        if any(os.environ.get(name) is not None for name in RICH_TERMINAL_VARS):
            return None
        stream = sys.stderr if target._kwargs.get("stderr") else sys.stdout
        try:
            return stream if not stream.isatty() else None
        except (AttributeError, ValueError):
            return None
    real = target._console if isinstance(target, _LazyConsole) else target
    try:
        if real.is_terminal or real.record or real.quiet or real.color_system is not None:
            return None
        return real.file
    except AttributeError:
        return None


def is_terminal(target: Any) -> bool:
    """``target.is_terminal``, without making a lazy console's Rich for a pipe."""
    if isinstance(target, _LazyConsole) and target._console is None and _plain_file(target):
        return False
    return bool(target.is_terminal)


def plain_text(text: str, *, markup: bool = True, emoji: bool = True,
               lines: bool = False) -> bool:
    """Whether Rich prints ``text`` as it is (soft-wrapped, no highlighting): no control
    character (Rich strips some and expands tabs; ``lines``: but line breaks), no '[' where
    it reads markup, no ``:code:`` where it replaces emoji codes."""
    if any((c < " " and not (lines and c == "\n")) or c == "\x7f" for c in text):
        return False
    if markup and "[" in text:
        return False
    return not (emoji and ":" in text and _EMOJI.search(text) is not None)


def plain(text: str, *, err: bool = False, target: Any = None, markup: bool = True,
          emoji: bool = True, lines: bool = False) -> bool:
    """Write ``text`` and a newline as ``target.print(text, highlight=False,
    soft_wrap=True, markup=..., emoji=...)`` would (``target``: the console, or the error
    console with ``err``), when that is the text itself; False (nothing written) when Rich
    must print it."""
    target = target if target is not None else (err_console if err else console)
    if not plain_text(text, markup=markup, emoji=emoji, lines=lines):
        return False
    stream = _plain_file(target)
    if stream is None:
        return False
    stream.write(text + "\n")
    stream.flush()
    return True


def say(text: str, *, err: bool = False, target: Any = None, markup: bool = False) -> None:
    """``text`` on its own line, as ``console.print(text, highlight=False, markup=...,
    soft_wrap=True)`` prints it."""
    if not plain(text, err=err, target=target, markup=markup):
        chosen = target if target is not None else (err_console if err else console)
        chosen.print(text, highlight=False, markup=markup, soft_wrap=True)


def escape(text: str) -> str:
    """``rich.markup.escape`` (Rich loaded only for a text it changes: one with '[', or
    ending in a backslash)."""
    if "[" not in text and not text.endswith("\\"):
        return text
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def error_line(message: str) -> None:
    """``error: MESSAGE`` on stderr (``message``: markup, e.g. escaped), bold red on a
    terminal."""
    if not plain("error: " + message, err=True):
        err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True,
                          soft_wrap=True)


def exit_code_of(exc: errors.BatchyardError) -> int:
    from batchyard import errors

    if isinstance(exc, errors.NotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, errors.ServerUnavailable):
        return EXIT_UNREACHABLE
    if isinstance(exc, errors.Forbidden) or exc.http_status == 403:
        return EXIT_FORBIDDEN
    if isinstance(exc, errors.UserError | errors.AuthError):
        return EXIT_BAD_INPUT
    return EXIT_ERROR


def emit(data: Any, output: Any, render: Callable[[Any], None] | None = None) -> None:
    """``data`` as JSON (``output`` json, or nothing to render it with), else rendered."""
    if output == "json" or render is None:  # (Output is a str enum)
        import json

        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return
    render(data)


_client: Client | None = None


def client() -> Client:
    """The one HTTP client of this process (made, and the server found, on first use). A
    local server started on demand is announced once, with its portal."""
    global _client
    if _client is None:
        from batchyard.client.http import Client
        from batchyard.config import home, read_server_info

        before = read_server_info()
        _client = Client.connect(quiet=True)
        after = read_server_info()
        if not os.environ.get("BATCHYARD_SERVER") and after is not None and (
                before is None or before.pid != after.pid):
            say(f"Started a local batchyard server at {after.url} (log: "
                f"{home() / 'server.log'}); portal: {after.url}/ (sign in "
                "with the token from `batchyard server token`)", err=True)
    return _client
