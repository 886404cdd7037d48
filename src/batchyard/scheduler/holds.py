"""Which queued jobs may be scheduled at all this pass: dependencies (Slurm's afterok /
afterany / afternotok) and job-array throttles (``--array 0-99%8``). Pure, like the rest of
the scheduler: the reconciler builds the views, this says which jobs go on to ``schedule()``,
which wait (with a reason naming what they wait for) and which can never run (a dependency
that can no longer be met), and why.

A failure is transitive within one pass: when A fails, B (waiting for A to succeed) fails,
and so does C waiting for B, each naming the job before it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from batchyard.scheduler import reasons

TERMINAL = frozenset({"succeeded", "failed", "canceled"})
RUNNING = frozenset({"preparing", "running", "finalizing"})


@dataclass(frozen=True, slots=True)
class DepView:
    job_id: int
    name: str  # as the user wrote it, for the reason
    condition: str  # succeeded | finished | failed


@dataclass(frozen=True, slots=True)
class HoldView:
    id: int
    deps: tuple[DepView, ...] = ()
    array: tuple[int, str] | None = None  # (experiment id, array name)
    array_index: int = 0
    array_limit: int | None = None


@dataclass(slots=True)
class Holds:
    runnable: list[int] = field(default_factory=list)
    pending: dict[int, str] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)


def _verdict(dep: DepView, state: str | None) -> bool | None:
    """True: met; False: can never be met; None: not yet."""
    if state is None:
        return False  # deleted
    if state not in TERMINAL:
        return None
    if dep.condition == "finished":
        return True
    if dep.condition == "failed":
        return state in ("failed", "canceled")
    return state == "succeeded"


def evaluate(queued: list[HoldView], states: dict[int, str],
             array_running: dict[tuple[int, str], int]) -> Holds:
    """``states``: the state of every job a dependency names (missing: deleted);
    ``array_running``: per array, how many of its jobs are preparing or running."""
    out = Holds()
    states = dict(states)
    changed = True
    while changed:  # to a fixpoint: a job failed here fails those waiting for it to succeed
        changed = False
        for job in queued:
            if job.id in out.failed or not job.deps:
                continue
            why = _first_problem(job, states)
            if why is not None and why[0] == "never":
                out.failed[job.id] = why[1]
                states[job.id] = "failed"
                changed = True
    waiting: set[int] = set()
    for job in queued:
        if job.id in out.failed or not job.deps:
            continue
        why = _first_problem(job, states)
        if why is not None:
            waiting.add(job.id)
            out.pending[job.id] = why[1]
    free = [j for j in queued if j.id not in out.failed and j.id not in waiting]
    by_array: dict[tuple[int, str], list[HoldView]] = defaultdict(list)
    for job in free:
        if job.array is not None and job.array_limit is not None:
            by_array[job.array].append(job)
        else:
            out.runnable.append(job.id)
    for key, jobs in by_array.items():
        limit = jobs[0].array_limit or 0
        running = array_running.get(key, 0)
        slots = max(0, limit - running)
        jobs.sort(key=lambda j: j.array_index)
        out.runnable.extend(j.id for j in jobs[:slots])
        for job in jobs[slots:]:
            out.pending[job.id] = reasons.array_throttled(key[1], limit, running)
    return out


def _first_problem(job: HoldView, states: dict[int, str]) -> tuple[str, str] | None:
    unmet: list[DepView] = []
    for dep in job.deps:
        state = states.get(dep.job_id)
        verdict = _verdict(dep, state)
        if verdict is False:
            return "never", reasons.dependency_never(dep.name, dep.condition, state)
        if verdict is None:
            unmet.append(dep)
    if not unmet:
        return None
    first = unmet[0]
    return "wait", reasons.dependency_wait(first.name, first.condition,
                                           states.get(first.job_id, "queued"), len(unmet) - 1)
