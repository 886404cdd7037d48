"""Options, output and error handling shared by every command."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import typer

from batchyard import errors

if TYPE_CHECKING:
    from rich.console import Console

    from batchyard.client.http import Client

# Start-up cost matters here: every command pays for what this module imports. Rich's console
# and tables, the HTTP client (httpx, ssl) and anything heavier load on first use, so
# `batchyard --help` or `version` import none of them.


class _LazyConsole:
    """A rich ``Console`` made on first use; ``console.print`` etc. behave as on the real
    one."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


console = cast("Console", _LazyConsole())
err_console = cast("Console", _LazyConsole(stderr=True))
F = TypeVar("F", bound=Callable[..., Any])


class Output(str, Enum):
    table = "table"
    json = "json"


OutputOpt = typer.Option(Output.table, "--output", "-o", help="table (default) or json.")
WorkspaceOpt = typer.Option(
    None, "--workspace", "-w", envvar="BATCHYARD_WORKSPACE",
    help="Workspace (default: 'default').", show_envvar=False,
)
ExperimentOpt = typer.Option(None, "--experiment", "-e",
                             help="Experiment (default: 'default').")
ResourceGroupOpt = typer.Option(None, "--resource-group", "-g",
                                help="Accepted for az batchai compatibility; recorded only.",
                                hidden=True)


def ws_name(value: str | None) -> str:
    return value or "default"


def exp_name(value: str | None) -> str:
    return value or "default"


_client: Client | None = None


def client() -> Client:
    """The one HTTP client of this process (made, and the server found, on first use)."""
    global _client
    if _client is None:
        from batchyard.client.http import Client

        _client = Client.connect()
    return _client


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True,
                      soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def handled() -> Iterator[None]:
    """User errors exit 2 with one line, server trouble exits 1; never a traceback."""
    try:
        yield
    except errors.UserError as exc:
        fail(_escape(exc.message), 2)
    except errors.AuthError as exc:
        fail(_escape(exc.message), 2)
    except errors.BatchyardError as exc:
        fail(_escape(exc.message), 1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(130) from None


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def emit(data: Any, output: Output, render: Callable[[Any], None] | None = None) -> None:
    if output == Output.json or render is None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return
    render(data)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
          title: str | None = None) -> None:
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold")
    for _key, header in columns:
        t.add_column(header, overflow="fold")
    for row in rows:
        t.add_row(*[_cell(row.get(key)) for key, _ in columns])
    console.print(t)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        return json.dumps(value)
    from rich.markup import escape

    return escape(str(value))


def key_values(data: dict[str, Any], keys: Sequence[str]) -> None:
    from rich.table import Table

    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for key in keys:
        if key in data:
            t.add_row(key, _cell(data[key]))
    console.print(t)


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
