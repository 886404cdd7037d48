"""RunDetails(run).show(): a live view of a run — its status, each node's ranks (lines logged
and the latest one) and the latest value of every metric.

In Jupyter it is an ipywidgets widget updated in the background (without ipywidgets, an HTML
display updated in place); in a terminal a Rich live view that returns when the run ends.
"""

from __future__ import annotations

import html
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from batchyard.compat.azureml._common import TERMINAL_STATUS, aml_status

LINE = re.compile(r"^\[(?P<node>[^/\]]+)/(?P<what>[^\]]+)\] ?(?P<text>.*)$")


@dataclass
class RankProgress:
    lines: int = 0
    last: str = ""


@dataclass
class Snapshot:
    """What the view shows at one moment."""

    run_id: str
    status: str = "NotStarted"
    target: str | None = None
    message: str | None = None
    nodes: dict[str, dict[str, RankProgress]] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    started: float | None = None
    ended: float | None = None

    def add_log(self, text: str) -> None:
        for line in text.splitlines():
            m = LINE.match(line)
            node, what, body = (m["node"], m["what"], m["text"]) if m else ("-", "-", line)
            progress = self.nodes.setdefault(node, {}).setdefault(what, RankProgress())
            progress.lines += 1
            progress.last = body[-160:]

    def add_metrics(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            entry = self.metrics.setdefault(row["name"], {"count": 0})
            entry.update(value=row["value"], step=row.get("step"), rank=row.get("rank"))
            entry["count"] += 1

    @property
    def duration(self) -> str:
        if self.started is None:
            return "-"
        seconds = (self.ended or time.time()) - self.started
        return f"{seconds:.0f}s"


def render_text(snap: Snapshot) -> Any:
    """A Rich renderable of the snapshot."""
    from rich.console import Group
    from rich.table import Table

    head = Table.grid(padding=(0, 2))
    head.add_row("[bold]Run[/]", snap.run_id, "[bold]Status[/]", snap.status,
                 "[bold]Target[/]", snap.target or "-", "[bold]Duration[/]", snap.duration)
    parts: list[Any] = [head]
    if snap.message:
        parts.append(f"[dim]{html.escape(snap.message)}[/]")
    nodes = Table(title="Nodes", title_justify="left", expand=False)
    for column in ("Node", "Process", "Lines", "Latest line"):
        nodes.add_column(column, overflow="fold")
    for node, ranks in sorted(snap.nodes.items()):
        for what, progress in sorted(ranks.items()):
            nodes.add_row(node, what, str(progress.lines), progress.last)
    parts.append(nodes)
    table = Table(title="Metrics", title_justify="left", expand=False)
    for column in ("Name", "Latest value", "Step", "Rank", "Values"):
        table.add_column(column, overflow="fold")
    for name, entry in snap.metrics.items():
        table.add_row(name, _short(entry.get("value")), _cell(entry.get("step")),
                      _cell(entry.get("rank")), str(entry["count"]))
    parts.append(table)
    return Group(*parts)


def render_html(snap: Snapshot) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(node)}</td><td>{esc(what)}</td><td>{p.lines}</td>"
        f"<td><code>{esc(p.last)}</code></td></tr>"
        for node, ranks in sorted(snap.nodes.items()) for what, p in sorted(ranks.items()))
    metrics = "".join(
        f"<tr><td>{esc(name)}</td><td>{esc(_short(e.get('value')))}</td>"
        f"<td>{_cell(e.get('step'))}</td><td>{_cell(e.get('rank'))}</td><td>{e['count']}</td></tr>"
        for name, e in snap.metrics.items())
    message = f"<p><i>{esc(snap.message)}</i></p>" if snap.message else ""
    return (f"<p><b>Run</b> {esc(snap.run_id)} &nbsp; <b>Status</b> {esc(snap.status)} &nbsp; "
            f"<b>Target</b> {esc(snap.target or '-')} &nbsp; <b>Duration</b> {snap.duration}</p>"
            f"{message}<table><tr><th>Node</th><th>Process</th><th>Lines</th>"
            f"<th>Latest line</th></tr>{rows}</table><table><tr><th>Metric</th>"
            f"<th>Latest value</th><th>Step</th><th>Rank</th><th>Values</th></tr>{metrics}"
            "</table>")


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _short(value: Any) -> str:
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


class RunDetails:
    """``RunDetails(run).show()`` as in azureml.widgets."""

    def __init__(self, run_instance: Any) -> None:
        self.run = run_instance
        self.snapshot = Snapshot(run_instance.id)
        self.widget: Any = None
        self._last_metric: int | None = None
        self._lock = threading.Lock()

    def refresh(self) -> Snapshot:
        """Read the run's state and new metrics into :attr:`snapshot`."""
        job = self.run.job
        data = job.refresh()
        rows = job.metrics(after=self._last_metric)
        with self._lock:
            snap = self.snapshot
            snap.status = aml_status(data.get("state"))
            snap.target = data.get("cluster")
            snap.message = data.get("pending_reason") or data.get("message")
            snap.started, snap.ended = data.get("started_at"), data.get("ended_at")
            if rows:
                self._last_metric = rows[-1]["id"]
                snap.add_metrics(rows)
        return self.snapshot

    def _follow_logs(self) -> None:
        try:
            for text in self.run.job.logs(follow=True):
                with self._lock:
                    self.snapshot.add_log(text)
        except Exception:  # the view must not die with a broken stream
            return

    def _start_tail(self) -> threading.Thread:
        thread = threading.Thread(target=self._follow_logs, name="run-details-logs",
                                  daemon=True)
        thread.start()
        return thread

    def show(self, refresh_seconds: float = 2.0, timeout: float | None = None) -> None:
        """A live widget in Jupyter (returns at once, updates in the background); a Rich live
        view in a terminal (returns when the run ends or after ``timeout`` seconds)."""
        if _in_jupyter():
            self._show_notebook(refresh_seconds)
        else:
            self._show_terminal(refresh_seconds, timeout)

    def _show_terminal(self, refresh_seconds: float, timeout: float | None) -> None:
        from rich.console import Console
        from rich.live import Live

        tail = self._start_tail()
        deadline = None if timeout is None else time.monotonic() + timeout
        console = Console()
        with Live(render_text(self.refresh()), console=console, auto_refresh=False) as live:
            while self.snapshot.status not in TERMINAL_STATUS:
                if deadline is not None and time.monotonic() > deadline:
                    break
                time.sleep(refresh_seconds)
                live.update(render_text(self.refresh()), refresh=True)
            tail.join(timeout=5)
            live.update(render_text(self.refresh()), refresh=True)
        console.print()

    def _show_notebook(self, refresh_seconds: float) -> None:
        from IPython.display import HTML, display

        try:
            import ipywidgets
        except ImportError:
            ipywidgets = None
        self._start_tail()
        if ipywidgets is not None:
            self.widget = ipywidgets.HTML(value=render_html(self.refresh()))
            display(self.widget)

            def update(value: str) -> None:
                self.widget.value = value
        else:
            handle = display(HTML(render_html(self.refresh())), display_id=True)

            def update(value: str) -> None:
                if handle is not None:
                    handle.update(HTML(value))

        def loop() -> None:
            while self.snapshot.status not in TERMINAL_STATUS:
                time.sleep(refresh_seconds)
                update(render_html(self.refresh()))
            time.sleep(1.0)
            update(render_html(self.refresh()))

        threading.Thread(target=loop, name="run-details", daemon=True).start()


def _in_jupyter() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


__all__ = ["RunDetails", "Snapshot", "render_html", "render_text"]
