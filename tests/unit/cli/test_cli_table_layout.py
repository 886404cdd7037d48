"""`common.table` hands rich each identifier column's width as a fixed width and each cell as
rich's own Text of it, so a 100-row `job list` renders in about half the time; the layout must
be rich's measured one exactly (random tables, widths and colours against the plain way)."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from batchyard.cli import common, job

WORDS = ["a", "job", "waiting", "for", "the", "scheduler", "[bold]x[/]", ":smile:", "ünï",
         "日本語", "x" * 40, "/very/long/path/to/some/file.txt", "1.5", "42", "-", "a\\b", "[",
         "]", "é", "node-0,node-1"]
KINDS = ["id", "num", "text", "path", "cut", "id?", "num?", "text?", "path?", "cut?"]


def measured(rows: list[dict[str, Any]], columns: list[tuple[str, ...]],
             title: str | None) -> None:
    """The table as rich measures every cell (string cells, identifiers and one-line text
    min = max width)."""
    cells = [[common._cell(row.get(col[0])) for col in columns] for row in rows]
    kinds = [col[2] if len(col) > 2 else "id" for col in columns]
    wants = [max([len(col[1])] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    keep, widths = common._fit([k.rstrip("?") for k in kinds],
                               [k.endswith("?") for k in kinds], wants, common.console.width,
                               [k.endswith("??") for k in kinds])
    t = Table(title=title, box=None, show_edge=False, pad_edge=False,
              padding=(0, common.GAP, 0, 0), header_style="bold", collapse_padding=True)
    for i, col in enumerate(columns):
        if not keep[i]:
            continue
        kind = kinds[i].rstrip("?")
        if kind == "text":
            t.add_column(col[1], overflow="ellipsis", min_width=widths[i])
        elif kind == "path":
            t.add_column(col[1], overflow="fold", min_width=widths[i])
        else:
            t.add_column(col[1], no_wrap=True, overflow="ellipsis", min_width=widths[i],
                         max_width=widths[i], justify="right" if kind == "num" else "left")
    for row_cells in cells:
        t.add_row(*[c for c, k in zip(row_cells, keep, strict=True) if k])
    common.console.print(t)


def _value(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.1:
        return None
    if r < 0.2:
        return rng.randint(-5, 100000)
    if r < 0.25:
        return rng.random() * 100
    if r < 0.3:
        return rng.choice([True, False])
    if r < 0.33:
        return {"k": rng.choice(WORDS)}
    if r < 0.36:
        return [rng.choice(WORDS) for _ in range(rng.randint(0, 3))]
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8)))


@pytest.mark.parametrize("seed", range(4))
def test_layout_is_richs_measured_one(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        columns: list[tuple[str, ...]] = (
            job.COLUMNS if rng.random() < 0.3 else
            [(f"k{i}", rng.choice(["Name", "State", "Reason / message", "X", "A long header"]),
              rng.choice(KINDS)) for i in range(rng.randint(1, 8))])
        rows = [{c[0]: _value(rng) for c in columns} for _ in range(rng.randint(1, 12))]
        width = rng.choice([10, 20, 30, 40, 60, 80, 100, 120, 200])
        color = rng.random() < 0.5
        title = rng.choice([None, "attempt 1"])
        out = []
        for render in (common.table, measured):
            buf = io.StringIO()
            monkeypatch.setattr(common, "console", Console(  # a terminal (a pipe: lines)
                file=buf, width=width, force_terminal=True,
                color_system="truecolor" if color else None))
            render(rows, columns, title=title)
            out.append(buf.getvalue())
        assert out[0] == out[1], (width, color, columns, rows)
