"""A queued job's pending reason (a sentence for people, scheduler/reasons.py) reduced to a
class for a metric label: a handful of fixed values, whatever the sentence says."""

from __future__ import annotations

# (class, what the sentence starts with), first match wins
_STARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("quota", ("quota:",)),
    ("dependency", ("waiting for job ", "dependency never")),
    ("array_limit", ("array ",)),
    ("behind_other_job", ("waiting behind job",)),
    ("nodes", ("waiting for ", "cluster has no nodes")),
    ("external_queue", ("slurm job", "being handed to slurm", "ray ")),
    ("retry", ("waiting to retry",)),
)
CLASSES = ("scheduler", "nodes", "quota", "dependency", "array_limit", "behind_other_job",
           "cannot_fit", "external_queue", "retry", "other")


def reason_class(reason: str | None) -> str:
    if not reason or reason == "waiting for the scheduler":
        return "scheduler"
    text = reason.strip().lower()
    if "cannot start until" in text:
        return "cannot_fit"
    for name, starts in _STARTS:
        if text.startswith(starts):
            return name
    return "other"
