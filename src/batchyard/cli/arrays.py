"""Job arrays and dependencies in the CLI: the ``--array``/``--depends-on`` options of `job
create`, one row per array in `job list`, and `job show` of an array. Imported only when a
command meets an array (start-up cost)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from batchyard.errors import UserError

CONDITIONS = ("succeeded", "finished", "failed")
ORDER = ("running", "preparing", "finalizing", "queued", "succeeded", "failed", "canceled")


def with_array_options(body: dict[str, Any], array: str | None,
                       depends_on: list[str]) -> dict[str, Any]:
    """The job's fields with ``--array`` and ``--depends-on`` applied; a bad value is a
    UserError naming the option (exit 2)."""
    out = dict(body)
    if array is not None:
        from batchyard.spec.arrays import parse_array

        try:
            parse_array(array)
        except ValueError as exc:
            raise UserError(f"--array {exc}") from None
        out["array"] = array
    deps = list(out.get("depends_on") or [])
    for item in depends_on:
        name, _, condition = item.partition(":")
        condition = condition or "succeeded"
        if not name or condition not in CONDITIONS:
            raise UserError(f"--depends-on {item!r}: give NAME or NAME:CONDITION, CONDITION "
                            f"one of {', '.join(CONDITIONS)}")
        deps.append({"job": name, "condition": condition})
    out["depends_on"] = deps
    return out


def submitted_line(d: dict[str, Any]) -> str:
    limit = f", at most {d['limit']} at once" if d.get("limit") else ""
    return (f"job array {d['name']} ({d['count']} jobs{limit}) submitted to cluster "
            f"{d['cluster']} (experiment {d['experiment']}): {d['jobs'][0]} ... "
            f"{d['jobs'][-1]}")


def states_text(states: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{states[s]} {s}" for s in ORDER if states.get(s))


def grouped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Jobs of one array (same experiment and array name) become one row, where the first
    of them stood: `sim[0-19%4]  4 running, 12 queued, 4 succeeded`."""
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("array"):
            groups.setdefault((row.get("experiment"), row["array"]), []).append(row)
    out: list[dict[str, Any]] = []
    seen: set[tuple[Any, Any]] = set()
    for row in rows:
        key = (row.get("experiment"), row.get("array"))
        if not row.get("array"):
            out.append(row)
            continue
        if key in seen:
            continue
        seen.add(key)
        members = groups[key]
        indices = sorted(int(m["array_index"]) for m in members if m.get("array_index")
                         is not None)
        span = f"{indices[0]}-{indices[-1]}" if indices else "?"
        states = Counter(m["state"] for m in members)
        first = members[0]
        out.append({"name": f"{row['array']}[{span}] ({len(members)} jobs)",
                    "experiment": first.get("experiment"), "cluster": first.get("cluster"),
                    "state": next(s for s in ORDER if states.get(s)),
                    "nodes_x": f"{first['nodes']} x {first['processes_per_node']}",
                    "dur": "-", "exit_code": None, "why": states_text(states)})
    return out


def render_array(d: dict[str, Any]) -> None:
    from batchyard.cli.common import key_values, table

    head = {**d, "jobs_n": d["count"], "states": states_text(d.get("job_states") or {})}
    key_values(head, [("name", "Job array"), ("experiment", "Experiment"),
                      ("cluster", "Cluster"), ("spec_array", "Indices"),
                      ("limit", "At most at once"), ("jobs_n", "Jobs"), ("states", "States")])
    table(d["jobs"], [("index", "Index", "num"), ("name", "Name"), ("state", "State"),
                      ("exit_code", "Exit", "num?"), ("reason", "Reason / message", "text")])
