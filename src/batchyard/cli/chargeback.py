"""`batchyard usage report`, `batchyard price set|list` and `batchyard budget set|list`."""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import sys
import time
from enum import Enum
from typing import Any

import typer

from batchyard.cli import groups
from batchyard.cli.common import (
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    emit,
    handled,
    table,
    ws_name,
)
from batchyard.errors import SpecError

usage_app = groups.usage
price_app = groups.price
budget_app = groups.budget


class ReportOutput(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


class By(str, Enum):
    user = "user"
    team = "team"
    workspace = "workspace"
    cluster = "cluster"
    size = "size"


def when(value: str, flag: str, at: float) -> float:
    """A time: a duration before now (30d, 12h) or an ISO date or date-time (UTC unless it
    says otherwise)."""
    from batchyard.spec.durations import parse_duration

    try:
        return at - parse_duration(value)
    except (TypeError, ValueError):
        pass
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise SpecError(f"{flag}: {value!r} is neither a duration before now (30d, 12h) nor "
                        "a date (2026-11-01, 2026-11-01T08:00)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def _cost(row: dict[str, Any]) -> str:
    if row.get("cost") is not None:
        return f"{row['cost']:.2f} {row['currency']}"
    costs = row.get("costs") or {}
    return " + ".join(f"{v:.2f} {c}" for c, v in costs.items()) or "-"


@usage_app.callback()
def quota_usage(ctx: typer.Context, workspace: str = WorkspaceOpt,
                output: Output = OutputOpt) -> None:
    """vCPU and GPU use per node family against the workspace's quota (`batchyard usage`);
    `batchyard usage report` for hours and costs."""
    if ctx.invoked_subcommand is not None:
        return
    with handled():
        rows = client().get(f"/workspaces/{ws_name(workspace)}/usage")
        emit(rows, output, lambda d: table(d, [
            ("family", "Family"), ("vcpus_in_use", "vCPU in use", "num"),
            ("vcpus_allocated", "vCPU allocated", "num"), ("vcpu_limit", "vCPU limit", "num"),
            ("gpus_in_use", "GPU in use", "num"), ("gpu_limit", "GPU limit", "num")],
            empty="no nodes in use and no quotas set"))


@usage_app.command("report")
def report(by: By = typer.Option(By.team, "--by", help="Group by user, team, workspace, "
                                 "cluster or size."),
           since: str = typer.Option("30d", "--since", help="From: a duration before now "
                                     "(30d) or a date (2026-11-01)."),
           until: str = typer.Option(None, "--until", help="Up to (default now): a duration "
                                     "before now or a date."),
           output: ReportOutput = typer.Option(ReportOutput.table, "--output", "-o",
                                               help="table (default), json or csv.")) -> None:
    """GPU-hours, CPU-hours and node-hours from the attempts' running intervals, with a
    cost where the node size has a price (`batchyard price set`). Admins."""
    with handled():
        at = time.time()
        start = when(since, "--since", at)
        end = when(until, "--until", at) if until else None
        if end is not None and end <= start:
            raise SpecError("--until: must be after --since")
        data = client().get("/usage", by=by.value, since=start, until=end)
        rows = data["rows"]
        if output == ReportOutput.json:
            emit(data, Output.json)
            return
        if output == ReportOutput.csv:
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow([by.value, "gpu_hours", "cpu_hours", "node_hours", "cost",
                             "currency"])
            for row in rows:
                writer.writerow([row[by.value], row["gpu_hours"], row["cpu_hours"],
                                 row["node_hours"], "" if row["cost"] is None else row["cost"],
                                 row["currency"] or ""])
            sys.stdout.write(out.getvalue())
            return
        shown = [{**r, "gpu": f"{r['gpu_hours']:.2f}", "cpu": f"{r['cpu_hours']:.2f}",
                  "node": f"{r['node_hours']:.2f}", "cost_text": _cost(r)} for r in rows]
        table(shown, [(by.value, by.value.capitalize()), ("gpu", "GPU-h"), ("cpu", "CPU-h"),
                      ("node", "Node-h"), ("cost_text", "Cost")], empty="no usage")


@price_app.command("set")
def price_set(size: str = typer.Option(..., "--size", "-s", help="The node size."),
              per_hour: float = typer.Option(..., "--per-hour", min=0.0,
                                             help="What one node costs an hour."),
              currency: str = typer.Option("USD", "--currency", help="As EUR, USD."),
              output: Output = OutputOpt) -> None:
    """Set the price of a node size (admins): `usage report` adds the cost."""
    with handled():
        if not math.isfinite(per_hour):
            raise SpecError("--per-hour: a finite number")
        data = client().request("PUT", f"/prices/{size}",
                                json={"per_hour": per_hour, "currency": currency})
        emit(data, output, lambda d: console.print(
            f"{d['size']}: {d['per_hour']:g} {d['currency']} a node-hour", highlight=False,
            markup=False))


@price_app.command("list")
def price_list(output: Output = OutputOpt) -> None:
    """The prices of node sizes."""
    with handled():
        emit(client().get("/prices"), output, lambda d: table(
            d, [("size", "Size"), ("per_hour", "Per hour"), ("currency", "Currency")],
            empty="no prices"))


@budget_app.command("set")
def budget_set(team: str = typer.Option(..., "--team", help="The team."),
               gpu_hours: float = typer.Option(..., "--gpu-hours", min=0.0,
                                               help="GPU-hours a period."),
               period: str = typer.Option("month", "--period", help="day, week or month "
                                          "(calendar, UTC)."),
               action: str = typer.Option("warn", "--action", help="warn (on submit) or "
                                          "hold (the team's jobs wait)."),
               output: Output = OutputOpt) -> None:
    """Set a team's budget of GPU-hours (admins). Past it, submits warn; with --action
    hold, the team's queued jobs wait, their reason naming the budget."""
    with handled():
        if period not in ("day", "week", "month"):
            raise SpecError(f"--period: one of day, week, month, not {period!r}")
        if action not in ("warn", "hold"):
            raise SpecError(f"--action: one of warn, hold, not {action!r}")
        data = client().request("PUT", f"/budgets/{team}", json={
            "gpu_hours": gpu_hours, "period": period, "action": action})
        emit(data, output, lambda d: console.print(
            f"team {d['team']}: {d['gpu_hours']:g} GPU-h a {d['period']} ({d['action']}); "
            f"{d['used_gpu_hours']:.1f} used", highlight=False, markup=False))


@budget_app.command("list")
def budget_list(output: Output = OutputOpt) -> None:
    """Budgets of teams, and what each used this period."""
    with handled():
        emit(client().get("/budgets"), output, lambda d: table(
            d, [("team", "Team"), ("gpu_hours", "GPU-h"), ("period", "Period"),
                ("action", "Action"), ("used_gpu_hours", "Used")], empty="no budgets"))
