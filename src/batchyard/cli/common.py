"""Options, output and error handling shared by every command."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Any, NoReturn, TypeVar

import typer

from batchyard import errors
from batchyard.cli import complete
from batchyard.cli.out import (  # noqa: F401  (re-exported: every command imports them here)
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_ERROR,
    EXIT_FORBIDDEN,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_UNREACHABLE,
    client,
    console,
    emit,
    err_console,
    error_line,
    exit_code_of,
    is_terminal,
    plain,
    plain_text,
    say,
)
from batchyard.cli.out import escape as _escape

# Start-up cost matters here: every command pays for what this module imports. Rich's console
# and tables, the HTTP client and anything heavier load on first use, so `batchyard --help`
# or `version` import none of them; cli/out.py prints what Rich would print as plain text
# without Rich.

F = TypeVar("F", bound=Callable[..., Any])


class Output(str, Enum):
    table = "table"
    json = "json"


def path_safe(value: str | None) -> str | None:
    """Names become URL path segments: one holding '/' or being '.'/'..' would be turned
    into another path by the HTTP client before the server could name it."""
    if value is not None and ("/" in value or "\0" in value or value in (".", "..")):
        raise typer.BadParameter(f"{value!r} is not a name: names may not contain '/' or be "
                                 "'.' or '..'")
    return value


OutputOpt = typer.Option(Output.table, "--output", "-o", help="table (default) or json.")
WorkspaceOpt = typer.Option(
    None, "--workspace", "-w", envvar="BATCHYARD_WORKSPACE",
    help="Workspace (default: 'default').", show_envvar=False, callback=path_safe,
    autocompletion=complete.workspaces,
)
ExperimentOpt = typer.Option(None, "--experiment", "-e", callback=path_safe,
                             autocompletion=complete.experiments,
                             help="Experiment (default: 'default'; for an existing job, the "
                             "one holding a job of that name when only one does).")
# A listing's filter: no -e means every experiment (not 'default', as for one job).
ListExperimentOpt = typer.Option(None, "--experiment", "-e", callback=path_safe,
                                 autocompletion=complete.experiments,
                                 help="Only this experiment's (default: every experiment's).")
ResourceGroupOpt = typer.Option(None, "--resource-group", "-g",
                                help="Accepted for az batchai compatibility; recorded only.",
                                hidden=True)


COMPLETE = {"workspace": complete.workspaces, "cluster": complete.clusters,
            "experiment": complete.experiments, "job": complete.jobs, "sweep": complete.sweeps,
            "datastore": complete.datastores}


def name_arg(what: str) -> Any:
    """The positional NAME every show/delete/... command takes besides ``-n`` (completed
    with the names the server has)."""
    return typer.Argument(None, metavar="NAME", show_default=False, callback=path_safe,
                          help=f"The {what}'s name (or give it with -n).",
                          autocompletion=COMPLETE.get(what))


def name_opt(what: str, *extra: str) -> Any:
    return typer.Option(None, "--name", "-n", *extra, help=f"The {what}'s name.",
                        callback=path_safe, autocompletion=COMPLETE.get(what))


def cluster_opt(help_text: str, default: Any = None) -> Any:
    """``--cluster/-c``, completed with the workspace's clusters."""
    return typer.Option(default, "--cluster", "-c", help=help_text,
                        autocompletion=complete.clusters)


def pick_name(positional: str | None, option: str | None, what: str,
              flag: str = "-n") -> str:
    """The name given either way (`job logs NAME` or `job logs -n NAME`)."""
    if positional and option and positional != option:
        fail(f"two names given ({positional!r} and {flag} {option!r}); give one")
    name = positional or option
    if not name:
        fail(f"give the {what}'s name: NAME or {flag} NAME")
    return name


def ws_name(value: str | None) -> str:
    return value or "default"


def exp_name(value: str | None) -> str:
    return value or "default"


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    error_line(message)
    raise typer.Exit(code)


@contextmanager
def handled(interrupted: str | None = None) -> Iterator[None]:
    """User errors exit 2, not found 3, no server 4, server trouble 1, each with one line;
    never a traceback. Ctrl-C exits 130, saying ``interrupted`` (e.g. how to re-attach)."""
    try:
        yield
    except errors.BatchyardError as exc:
        fail(_escape(exc.message), exit_code_of(exc))
    except KeyboardInterrupt:
        say(interrupted or "interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


# Tables ----------------------------------------------------------------------------------------
# Plain columns as kubectl and squeue print them (no box: every character goes to the data). A
# column is (key, header) or (key, header, kind). Kinds: "id" (default: names, states, sizes,
# counts; never wrapped), "num" (the same, right-aligned), "text" (free text such as messages:
# wraps between words), "cut" (free text kept to one line: cut with an ellipsis to the room
# every other column leaves, e.g. `job list`'s reason; `job show` has it whole) and "path"
# (file paths: folded only where there is no room, so they stay whole). A kind ending in "?"
# is optional: on a narrow terminal such columns are left out, last first, before any name is
# cut; only when even the rest cannot fit does an identifier end in an ellipsis. A "cut"
# column gives way to all the others (left out when under CUT_MIN), except those whose kind
# ends in "??" (optional, and second to the cut column: `job list`'s submitter), and whatever
# is left out is said on stderr.
# Piped (stdout is no terminal), a table is one line per row with every column whole, as
# squeue prints it, whatever the width: what a script greps or cuts. `-o json` always has
# every field.

Column = tuple[str, ...]  # (key, header) or (key, header, kind)
GAP = 2  # spaces between columns
TEXT_MIN = 16    # free text is never squeezed below this
TEXT_ROOMY = 30  # ... and keeps this much before an optional column is shown
CUT_MIN = 10     # a "cut" column keeps this much; every other column comes first


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column],
          title: str | None = None, empty: str | None = None) -> None:
    """Rows as a table; none: ``empty`` (e.g. "no jobs") on stderr, as kubectl does."""
    if not rows and empty:
        err_console.print(empty, highlight=False, markup=False)
        return
    if not is_terminal(console):
        _lines(rows, columns, title)
        return
    cells = [[_cell(row.get(col[0])) for col in columns] for row in rows]
    kinds = [col[2] if len(col) > 2 else "id" for col in columns]
    wants = [max([len(col[1])] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    keep, widths = _fit([k.rstrip("?") for k in kinds], [k.endswith("?") for k in kinds],
                        wants, console.width, [k.endswith("??") for k in kinds])
    left_out = [col[1] for col, k in zip(columns, keep, strict=True) if not k]
    # Rich measures every cell of a column to find its width; an identifier's is known here
    # (min = max). Given as a fixed width it is not measured again (a 100-row table renders
    # in about half the time), which is the same layout as long as the identifiers alone fit
    # the console: only then does rich never shrink a column that does not wrap.
    ids = [i for i, k in enumerate(kinds) if keep[i] and k.rstrip("?") in ("id", "num", "cut")]
    last = max((i for i, k in enumerate(keep) if k), default=-1)
    fixed = sum(widths[i] + (0 if i == last else GAP) for i in ids) <= console.width
    if fixed and title is None and len(ids) == sum(keep) and _printed_fast(
            cells, columns, keep, widths, [k.rstrip("?") == "num" for k in kinds]):
        _left_out(left_out)
        return
    from rich.table import Table

    t = Table(title=title, box=None, show_edge=False, pad_edge=False, padding=(0, GAP, 0, 0),
              header_style="bold", collapse_padding=True)
    for i, col in enumerate(columns):
        if not keep[i]:
            continue
        kind = kinds[i].rstrip("?")
        if kind == "text":
            t.add_column(col[1], overflow="ellipsis", min_width=widths[i])
        elif kind == "path":
            t.add_column(col[1], overflow="fold", min_width=widths[i])
        elif fixed:
            t.add_column(col[1], no_wrap=True, overflow="ellipsis", width=widths[i],
                         justify="right" if kind == "num" else "left")
        else:
            t.add_column(col[1], no_wrap=True, overflow="ellipsis", min_width=widths[i],
                         max_width=widths[i], justify="right" if kind == "num" else "left")
    # each cell as the Text rich would make of its markup, made once (rich parses a string
    # cell again each time it measures or renders it)
    render = console.render_str
    for row_cells in cells:
        t.add_row(*[render(c, highlight=False) for c, k in zip(row_cells, keep, strict=True)
                    if k])
    console.print(t)
    _left_out(left_out)


def _left_out(left_out: list[str]) -> None:
    if left_out:  # never without a word
        err_console.print(f"({', '.join(left_out)}: left out at {console.width} columns; a "
                          "wider terminal, a pipe or -o json shows every column)",
                          highlight=False, markup=False, style="dim", soft_wrap=True)


def _printed_fast(cells: list[list[str]], columns: Sequence[Column], keep: list[bool],
                  widths: list[int], right: list[bool]) -> bool:
    """A table of fixed-width columns only (identifiers, numbers, a cut reason) printed as
    Rich prints it, without Rich laying out each row (85 % of `job list`'s time at 2,000
    jobs): its header rendered by Rich, each row a line of cells padded (a number on the
    right) or cut with an ellipsis to their column's width, two spaces apart. Only for cells
    of printable ASCII that Rich shows as they are (`out.plain_text`), on a console that
    no live display draws on; False (nothing printed) otherwise."""
    shown = [i for i, k in enumerate(keep) if k]
    if not shown or not cells:
        return False
    for row in cells:
        for i in shown:
            text = row[i]
            if not (text.isascii() and text.isprintable() and plain_text(text)) \
                    or text != text.strip() or text.endswith("\\"):
                return False
    if getattr(console, "_live_stack", None) or getattr(console, "_render_hooks", None) \
            or console.record:
        return False
    from rich.table import Table

    head = Table(box=None, show_edge=False, pad_edge=False, padding=(0, GAP, 0, 0),
                 header_style="bold", collapse_padding=True)
    for i in shown:
        head.add_column(columns[i][1], no_wrap=True, overflow="ellipsis", width=widths[i],
                        justify="right" if right[i] else "left")
    with console.capture() as captured:
        console.print(head)
    lines = [captured.get().rstrip("\n")]
    gap = " " * GAP
    last = shown[-1] if shown else -1
    for row in cells:
        parts = []
        for i in shown:
            text, width = row[i], widths[i]
            if len(text) > width:
                text = text[:width - 1] + "…"
            parts.append(text.rjust(width) if right[i] else text.ljust(width))
            if i != last:
                parts.append(gap)
        lines.append("".join(parts))
    console.file.write("\n".join(lines) + "\n")
    console.file.flush()
    return True


def _lines(rows: Sequence[dict[str, Any]], columns: Sequence[Column],
           title: str | None) -> None:
    """The table for a pipe: a header line, then one line per row with every column whole
    (a line break or tab in a value becomes a space), numbers right-aligned, no styles."""
    texts = [[_one_line(_text(row.get(col[0]))) for col in columns] for row in rows]
    heads = [col[1] for col in columns]
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in texts]) for i, h in enumerate(heads)]
    right = [len(col) > 2 and col[2].rstrip("?") == "num" for col in columns]
    out = [title] if title else []
    for line in [heads, *texts]:
        parts = []
        for i, value in enumerate(line):
            pad = " " * (widths[i] - cell_len(value))
            parts.append(pad + value if right[i] else value + pad)
        out.append((" " * GAP).join(parts).rstrip())
    text = "\n".join(out)
    if not plain(text, target=console, markup=False, emoji=False, lines=True):
        console.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)


def cell_len(text: str) -> int:
    """The cells ``text`` takes on a terminal (``rich.cells.cell_len``; Rich loaded only for
    text that is not ASCII)."""
    if text.isascii():
        return len(text)
    from rich.cells import cell_len as rich_cell_len

    return rich_cell_len(text)


def _one_line(text: str) -> str:
    return " ".join(text.split()) if any(c in text for c in "\n\r\t\v\f") else text


def _fit(kinds: Sequence[str], optional: Sequence[bool], wants: Sequence[int],
         room: int, yields: Sequence[bool] = ()) -> tuple[list[bool], list[int]]:
    """Which columns to show and the width each needs at least: identifiers all they need,
    free text ``TEXT_MIN``; optional columns are added, narrowest first, while the free text
    keeps ``TEXT_ROOMY``. A "cut" column comes after all of them: it gets the room they leave
    (at most what it wants), and is left out when that is under ``CUT_MIN`` - unless leaving
    out the columns that ``yields`` (last first) makes that room."""
    cut = [i for i, k in enumerate(kinds) if k == "cut"]
    gone: set[int] = set()
    while True:
        keep, need = _fit_once(kinds, optional, wants, room, gone, yields)
        ceding = [i for i, y in enumerate(yields) if y and keep[i]]
        if all(keep[i] for i in cut) or not ceding:
            return keep, need
        gone.add(ceding[-1])


def _fit_once(kinds: Sequence[str], optional: Sequence[bool], wants: Sequence[int],
              room: int, gone: set[int], yields: Sequence[bool]
              ) -> tuple[list[bool], list[int]]:
    cut = [k == "cut" for k in kinds]
    flexible = [k in ("text", "path") for k in kinds]
    need = [min(w, TEXT_MIN) if f else w for w, f in zip(wants, flexible, strict=True)]

    def width(keep: Sequence[bool], sizes: Sequence[int] = need) -> int:
        shown = [n for n, k in zip(sizes, keep, strict=True) if k]
        return sum(shown) + GAP * (len(shown) - 1)

    keep = [not c and i not in gone for i, c in enumerate(cut)]
    if width(keep) > room:  # the narrowest optional columns first: the most of them fit
        roomy = [min(w, TEXT_ROOMY) if f else w for w, f in zip(wants, flexible, strict=True)]
        keep = [not o and not c for o, c in zip(optional, cut, strict=True)]
        last = set(i for i, y in enumerate(yields) if y)  # the least wanted come last
        for i in sorted((i for i, o in enumerate(optional) if o and not cut[i]
                         and i not in gone), key=lambda i: (i in last, wants[i])):
            keep[i] = True
            if width(keep, roomy) > room:
                keep[i] = False
    over = width(keep) - room
    if over > 0:  # cut the widest identifiers down (an ellipsis), never below 8 characters
        widths = list(need)
        while over > 0:
            widest = max((j for j in range(len(widths))
                          if keep[j] and not flexible[j] and not cut[j]),
                         key=lambda j: widths[j], default=None)
            if widest is None or widths[widest] <= 8:
                break
            widths[widest] -= 1
            over -= 1
        need = widths
    left = room - max(0, width(keep))
    for i in (i for i, c in enumerate(cut) if c):  # the room left, in order
        gap = GAP if any(keep) else 0
        if left - gap >= min(CUT_MIN, wants[i]):
            keep[i] = True
            need[i] = min(wants[i], left - gap)
            left -= need[i] + gap
    return keep, need


def _cell(value: Any) -> str:
    """A value as a table cell's markup (its text, escaped)."""
    if value is None or isinstance(value, bool | int | float):
        return _text(value)  # nothing in it reads as markup
    return _escape(_text(value))


def _text(value: Any) -> str:
    """A value as a table shows it: ``-`` for none, ``yes``/``no``, ``k=v, ...``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value) or "-"
    return str(value)


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        import json

        return json.dumps(value, default=str)
    return str(value)


def key_values(data: dict[str, Any], keys: Sequence[str | tuple[str, ...]]) -> None:
    """Fields under plain labels: ``keys`` are data keys, or (key, label[, ...])."""
    from rich.table import Table

    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    for item in keys:
        key, label = (item, label_of(item)) if isinstance(item, str) else (item[0], item[1])
        if key in data:
            t.add_row(label, _cell(data[key]))
    console.print(t)


def label_of(key: str) -> str:
    return key.replace("_", " ").capitalize()


# Human forms --------------------------------------------------------------------------------


def human_size(value: Any) -> str:
    """Bytes as people read them: 512 B, 1.5 KiB, 20.0 MiB."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def human_time(stamp: Any, now: float | None = None) -> str:
    """A timestamp as a local date and time with how long ago (or in how long) it is:
    ``2024-05-01 12:00 (5m ago)``."""
    if stamp in (None, ""):
        return "-"
    when = float(stamp)
    now = time.time() if now is None else now
    delta = now - when
    text = time.strftime("%Y-%m-%d %H:%M", time.localtime(when))
    return f"{text} ({_span(abs(delta))} ago)" if delta >= 0 else f"{text} (in {_span(-delta)})"


def _span(seconds: float) -> str:
    if seconds < 60:
        return f"{int(seconds)}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h"
    return f"{int(seconds // 86400)}d"


def counts(data: dict[str, Any] | None) -> str:
    """``{"idle": 2, "running": 0, ...}`` as ``2 idle`` (zeros left out); none: ``none``."""
    items = [f"{n} {state}" for state, n in (data or {}).items() if n]
    return ", ".join(items) or "none"


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def stderr_is_tty() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
