"""RunDetails(run).show(): a live view of a run — its status, each node's ranks (lines logged
and the latest one) and the latest value of every metric.

In Jupyter it is an ipywidgets widget updated in the background (without ipywidgets, an HTML
display updated in place); in a terminal a Rich live table that returns when the run ends;
where nothing can be redrawn (output to a pipe or a file) one table once the run has ended.
A server that is away for a moment does not end the view: it says so and asks again.
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
    """``RunDetails(run).show()`` as in azureml.widgets: a view that follows the run while it
    goes (a notebook's display, a terminal's live table), or, where nothing can be redrawn
    (a pipe, a log file), one table once the run has ended."""

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

    def _update(self) -> None:
        """`refresh`, riding out a server that is away for a moment (a restart, a dropped
        connection): the view keeps what it had, says so, and asks again next time."""
        try:
            self.refresh()
        except Exception as exc:  # the view must outlive a failed read
            with self._lock:
                self.snapshot.message = f"(the server did not answer: {exc}; retrying)"

    def text(self) -> Any:
        """The Rich view of the snapshot as it is now (made under the lock: the log thread
        may be adding a rank meanwhile)."""
        with self._lock:
            return render_text(self.snapshot)

    def html(self) -> str:
        with self._lock:
            return render_html(self.snapshot)

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
        """In Jupyter: a display updated in the background (returns at once). In a terminal:
        a Rich live table until the run ends (or ``timeout`` seconds). Elsewhere (output to a
        pipe or a file): nothing meanwhile, then one final table."""
        mode = _mode()
        if mode == "notebook":
            self._show_notebook(refresh_seconds)
        elif mode == "terminal":
            self._show_terminal(refresh_seconds, timeout)
        else:
            self._show_once(refresh_seconds, timeout)

    def _ended(self, deadline: float | None) -> bool:
        return self.snapshot.status in TERMINAL_STATUS or (
            deadline is not None and time.monotonic() > deadline)

    def _show_terminal(self, refresh_seconds: float, timeout: float | None) -> None:
        from rich.live import Live

        tail = self._start_tail()
        deadline = None if timeout is None else time.monotonic() + timeout
        console = _console()
        self._update()
        with Live(self.text(), console=console, auto_refresh=False) as live:
            while not self._ended(deadline):
                time.sleep(refresh_seconds)
                self._update()
                live.update(self.text(), refresh=True)
            tail.join(timeout=5)
            self._update()
            live.update(self.text(), refresh=True)
        console.print()

    def _show_once(self, refresh_seconds: float, timeout: float | None) -> None:
        tail = self._start_tail()
        deadline = None if timeout is None else time.monotonic() + timeout
        self._update()
        while not self._ended(deadline):
            time.sleep(refresh_seconds)
            self._update()
        tail.join(timeout=5)
        self._update()
        _console().print(self.text())

    def _show_notebook(self, refresh_seconds: float) -> None:
        from IPython.display import HTML, display

        try:
            import ipywidgets
        except ImportError:
            ipywidgets = None
        self._start_tail()
        self._update()
        if ipywidgets is not None:
            self.widget = ipywidgets.HTML(value=self.html())
            display(self.widget)

            def update(value: str) -> None:
                self.widget.value = value
        else:
            handle = display(HTML(self.html()), display_id=True)

            def update(value: str) -> None:
                if handle is not None:
                    handle.update(HTML(value))

        def loop() -> None:
            while self.snapshot.status not in TERMINAL_STATUS:
                time.sleep(refresh_seconds)
                self._update()
                update(self.html())
            time.sleep(1.0)
            self._update()
            update(self.html())

        threading.Thread(target=loop, name="run-details", daemon=True).start()


def _console() -> Any:
    from rich.console import Console

    return Console()


def _mode() -> str:
    """``notebook`` (an IPython kernel), ``terminal`` (a terminal that can redraw: a live
    table) or ``plain`` (a pipe, a file, a dumb terminal: one table at the end)."""
    if _in_jupyter():
        return "notebook"
    console = _console()
    return "terminal" if console.is_terminal and not console.is_dumb_terminal else "plain"


def _in_jupyter() -> bool:
    """An IPython kernel (Jupyter, VS Code, Colab), which shows displays, unlike a plain
    IPython shell in a terminal."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    kernel = type(shell).__name__ in ("ZMQInteractiveShell", "Shell")  # Shell: Colab's
    return kernel or "IPKernelApp" in getattr(shell, "config", {})


__all__ = ["RunDetails", "Snapshot", "render_html", "render_text"]
