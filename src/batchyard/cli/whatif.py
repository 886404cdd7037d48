"""`batchyard job create --what-if`: the answer, in words or as JSON (nothing submitted)."""

from __future__ import annotations

from typing import Any

from batchyard.cli.common import Output, console, emit, human_time, table


def ask(c: Any, jobs_path: str, payload: dict[str, Any], output: Output) -> None:
    result = c.post(jobs_path + "/what-if", payload)
    emit(result, output, render)


def when(start: float | None, now: float | None = None) -> str:
    if start is None:
        return "unknown"
    if now is not None and start <= now + 1:
        return "now"
    return human_time(start, now)


def render(d: dict[str, Any]) -> None:
    now = d.get("now")
    head = (f"what if: {d['nodes']} node(s) on cluster {d['cluster']} would start "
            f"{when(d.get('estimated_start'), now)}")
    if d.get("ahead") is not None:
        head += f" ({d['ahead']} job(s) ahead of it)"
    console.print(head + "; nothing was submitted", highlight=False, markup=False,
                  soft_wrap=True)
    for note in ([d["note"]] if d.get("note") else []) + list(d.get("notes") or ()):
        console.print(f"  {note}", highlight=False, markup=False, soft_wrap=True)
    sooner = d.get("sooner") or []
    if not sooner:
        console.print("no other size or cluster would start it sooner", highlight=False,
                      markup=False)
        return
    table([{**o, "start": when(o.get("estimated_start"), now)} for o in sooner],
          [("cluster", "Cluster"), ("nodes", "Nodes", "num"), ("start", "Would start"),
           ("ahead", "Ahead", "num"), ("note", "Note", "text")],
          title="Sooner")


def estimate_text(j: dict[str, Any]) -> str:
    """`job show`'s line for a queued job: when, how many jobs are booked before it, and
    what the estimate cannot know."""
    found = j.get("estimate") or {}
    text = when(j.get("estimated_start"))
    if found.get("ahead") is not None:
        text += f", {found['ahead']} job(s) ahead on its cluster"
    if found.get("note"):
        text += f" ({found['note']})"
    return text
