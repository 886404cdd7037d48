"""A failed job's cause under plain labels (``job show``, ``job wait``): the cause class,
where it happened (rank, node) and the rank's last error lines."""

from __future__ import annotations

from typing import Any

from batchyard.cli.common import console, key_values


def error_of(job: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(label, error): the job's own, else the latest attempt's (a preempted attempt of a job
    that was requeued)."""
    if job.get("error"):
        return "Failure", job["error"]
    for attempt in reversed(job.get("attempts") or []):
        if attempt.get("error"):
            return f"Attempt {attempt['number']}", attempt["error"]
    return "Failure", None


def render_error(job: dict[str, Any]) -> None:
    label, error = error_of(job)
    if not error:
        return
    where = []
    if error.get("rank") is not None:
        where.append(f"rank {error['rank']}")
    if error.get("what") not in (None, "rank", "node"):
        where.append(f"job {error['what']}")
    if error.get("node"):
        where.append(f"on node {error['node']}")
    row = {"cause": error.get("cause"), "where": " ".join(where) or None,
           "exit_code": error.get("exit_code"), "summary": error.get("summary")}
    key_values({k: v for k, v in row.items() if v is not None},
               [("cause", f"{label} cause"), ("where", "Failed at"),
                ("exit_code", "Exit code"), ("summary", "Error")])
    lines = error.get("lines") or []
    if lines:
        console.print("Error lines:", style="bold", highlight=False)
        for line in lines:
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
