"""Pending reasons in plain words.

Batch AI and AML users sat in "Queued" with no explanation; every job we do not start gets a
sentence saying what it waits for. These helpers only format: each is O(1) (the per-state node
counts are gathered once per cluster), so a 100k-job queue costs one f-string per job.
"""

from __future__ import annotations

import math


def plural(count: int, word: str) -> str:
    """'1 node', '2 nodes': reasons are read by people, not parsed."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def duration(seconds: float) -> str:
    """Round a wait to the unit a person would use; the estimate is rough anyway."""
    if seconds < 120:
        return f"{max(0, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def expected_start(start: float, now: float) -> str:
    """How to say when a reservation falls: a relative time reads better than an epoch."""
    if math.isinf(start):
        return "start time unknown"
    if start <= now:
        return "expected to start as soon as the nodes are ready"
    return f"expected to start in about {duration(start - now)}"


def when_clause(start: float, now: float) -> str:
    """The same, as a clause about another job: 'which is expected to start in about 5 min'."""
    if math.isinf(start):
        return "whose start time is unknown"
    return f"which is {expected_start(start, now)}"


def node_counts(
    idle: int,
    provisioning: int,
    running: int,
    leaving: int,
    unusable: int,
    preempted: int,
) -> str:
    """'0 idle, 2 provisioning, 3 running, 1 unusable': idle always shown, others when non-zero."""
    parts = [f"{idle} idle"]
    for count, label in (
        (provisioning, "provisioning"),
        (running, "running"),
        (leaving, "leaving"),
        (unusable, "unusable"),
        (preempted, "preempted"),
    ):
        if count:
            parts.append(f"{count} {label}")
    return ", ".join(parts)


def held_by(names: list[str], shown: int = 3) -> str:
    """'held by train-a, train-b and 3 more': who to wait for, or to ask, or to terminate."""
    head = ", ".join(names[:shown])
    more = len(names) - shown
    return f"held by {head} and {more} more" if more > 0 else f"held by {head}"


def relation(job_priority: int, head_priority: int) -> str:
    """Why the head goes first: a user reads 'higher priority' differently from FIFO."""
    return "higher priority" if head_priority > job_priority else "submitted earlier"


def job_label(job_id: int, name: str = "", experiment: str = "") -> str:
    """'job train-3 in experiment mnist': how `job show -n train-3 -e mnist` finds it (the
    database's id only when a view carries no name, as in the scheduler's own tests)."""
    if not name:
        return f"job {job_id}"
    return f"job {name} in experiment {experiment}" if experiment else f"job {name}"


def workspace_label(workspace_id: int, name: str = "") -> str:
    return f"workspace {name or workspace_id}"


def behind(head: str, why: str, when: str) -> str:
    """The reason of a job held back by the cluster's first waiting job (`head`: its
    job_label; `when`: when_clause)."""
    return f"waiting behind {head} ({why}), {when}"


def quota_over(
    family: str, unit: str, used: int, limit: int, workspace: str, needed: int
) -> str:
    """'quota: standardNCFamily 24/24 vCPUs in use in workspace team-a (needs 12 more)'
    (`workspace`: workspace_label)."""
    return (
        f"quota: {family} {used}/{limit} {unit} in use in {workspace} "
        f"(needs {needed} more)"
    )


def quota_never(family: str, unit: str, cost: int, limit: int, workspace: str) -> str:
    """A job larger than the whole quota would wait forever unless someone raises it."""
    return (
        f"quota: needs {cost} {family} {unit} but {workspace} is limited to "
        f"{limit}; it cannot start until the quota is raised"
    )


def quota_held(family: str, workspace: str, holder: str, why: str, when: str) -> str:
    """Quota kept free for an earlier job (`holder`: its job_label), so small jobs cannot
    starve it (`when`: when_clause)."""
    return (
        f"quota: {family} vCPUs in {workspace} are held for {holder} "
        f"({why}), {when}"
    )


def never_fits(nodes: int, cluster_name: str, capacity: int, autoscale: bool) -> str:
    """Submit should reject these; if the cluster shrank since, say so instead of waiting."""
    if nodes < 1:
        return f"invalid gang size {nodes}: a job needs at least 1 node"
    if capacity == 0:
        if not autoscale:  # parked (`cluster resize -t 0`): queued until it is resized
            return (
                f"cluster has no nodes: the size of {cluster_name!r} is 0; it starts once "
                f"the cluster is resized to {plural(max(nodes, 1), 'node')} or more "
                f"(`batchyard cluster resize -n {cluster_name} -t {max(nodes, 1)}`)"
            )
        return (
            f"cluster has no nodes: the maximum size of {cluster_name!r} is 0; "
            "it cannot start until the cluster is resized"
        )
    limit = f"can grow to at most {capacity}" if autoscale else f"has only {capacity}"
    return (
        f"needs {plural(nodes, 'node')} but cluster {cluster_name!r} {limit}; "
        "it cannot start until the cluster is enlarged"
    )


_CONDITION_VERB = {"succeeded": "succeed", "finished": "finish", "failed": "fail"}


def dependency_wait(name: str, condition: str, state: str, more: int) -> str:
    """'waiting for job prep to succeed (it is running)': the job it waits for, by name."""
    extra = f"; and {more} more {'dependency' if more == 1 else 'dependencies'}" if more else ""
    return (f"waiting for job {name} to {_CONDITION_VERB.get(condition, condition)} "
            f"(it is {state}){extra}")


def dependency_never(name: str, condition: str, state: str | None) -> str:
    """Why a dependency can no longer be met: the job it names ended the wrong way."""
    ended = "was deleted" if state is None else f"ended {state}"
    return (f"dependency never satisfied: job {name} {ended}, and this job needed it to "
            f"{_CONDITION_VERB.get(condition, condition)}")


def array_throttled(array: str, limit: int, running: int) -> str:
    """A job array's %N: how many of its jobs may run at once and how many do."""
    return (f"array {array}: at most {limit} of its jobs run at once "
            f"({running} running now)")
