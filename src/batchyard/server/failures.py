"""An ended attempt's failure cause, as a structured error and a one-line message: the error a
node reported first (by the time that node saw it) wins; causes only the server can know
(node lost, preempted) are built here in the same shape (node/failure.py)."""

from __future__ import annotations

import re
from typing import Any

from batchyard.backends.base import GangStatus
from batchyard.node import failure
from batchyard.store.models import Attempt

_NODE_NAMED = re.compile(r"\bnode (?:launcher on )?([\w.~-]+)")
_MPI_RANK = re.compile(r"MPI rank (\d+) ")


def _named_node(message: str | None, names: list[str]) -> str | None:
    for found in _NODE_NAMED.findall(message or ""):
        if found in names:
            return str(found)
    return None


def _with_cause(message: str | None, cause: str) -> str:
    return message if message and f"({cause})" in message else f"{message or cause} ({cause})"


def explain(attempt: Attempt, status: GangStatus, names: list[str], outcome: str,
            message: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(error, message) of an attempt ending as ``outcome`` with ``message``."""
    if outcome in ("succeeded", "canceled"):
        return None, message
    reason = attempt.cancel_reason
    if reason == "preempted":
        return failure.record(failure.PREEMPTED, node=_named_node(message, names),
                              summary=message, what="node"), _with_cause(message,
                                                                         failure.PREEMPTED)
    if reason == "requeue":
        return None, message
    if reason == failure.HUNG:  # the watchdog's verdict: the ranks it stopped fail after it
        return failure.record(failure.HUNG, node=None, summary=message,
                              what="gang"), message
    ended = str((attempt.handle or {}).get("queue_ended") or "")
    if "time limit" in ended:  # Slurm's --time, not a node that failed
        return failure.record(failure.WALL_CLOCK, node=None, summary=ended,
                              what="node"), _with_cause(message, failure.WALL_CLOCK)
    aborted = bool((attempt.control or {}).get("abort"))
    lost = [n for n in status.nodes if n.state == "lost"]
    # the queue's own verdict (Slurm's NODE_FAIL) wins over the ranks it took down
    if (reason in ("lost", "deallocated") and (not aborted or ended)) \
            or (lost and not aborted and reason is None):
        node = _named_node(message, names)
        if node is None and lost:
            node = names[lost[0].node_rank]
        return failure.record(failure.NODE_LOST, node=node, summary=message,
                              what="node"), _with_cause(message, failure.NODE_LOST)
    reported = [(n.raw.get("error"), n) for n in status.nodes
                if n.state in ("failed", "timeout") and isinstance(n.raw.get("error"), dict)]
    named = _MPI_RANK.match(message or "")
    if named:  # mpirun's node fails too (collateral): the named rank's own error comes first
        own = [e for e, _ in reported if e is not None and e.get("rank") == int(named[1])]
        reported = [(e, n) for e, n in reported if e in own] or reported
    chosen = failure.first([e for e, _ in reported])
    if chosen is None:
        return None, message
    head = next(n.message for e, n in reported if e is chosen)
    if message and message.startswith("MPI rank"):
        head = message  # the reconciler named the rank mpirun's node did not know
    if not head:
        return chosen, failure.message_of(chosen)
    if f"({chosen['cause']})" in head:
        return chosen, head
    return chosen, failure.message_of(chosen, head)
