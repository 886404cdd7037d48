"""An ended attempt's failure cause, as a structured error and a one-line message: the error a
node reported first (by the time that node saw it) wins; causes only the server can know
(node lost, preempted) are built here in the same shape (batchyard/failure_record.py)."""

from __future__ import annotations

import re
import signal
from typing import Any

from batchyard import failure_record as failure
from batchyard.backends.base import GangStatus
from batchyard.store.models import Attempt

_NODE_NAMED = re.compile(r"\bnode (?:launcher on )?([\w.~-]+)")
_MPI_RANK = re.compile(r"MPI rank (\d+) ")
# what a rank prints when a peer's process went away under it (gloo, NCCL, the c10d store)
_PEER_GONE = re.compile(
    r"Connection (?:closed|reset) by peer|remote worker crash|remote process exited|"
    r"Broken pipe|Connection refused|DistNetworkError|ncclRemoteError|"
    r"peer (?:closed|disconnected|went away)", re.I)
_TAKEN_DOWN = (signal.SIGTERM, signal.SIGKILL, signal.SIGHUP, signal.SIGPIPE)


def _named_node(message: str | None, names: list[str]) -> str | None:
    for found in _NODE_NAMED.findall(message or ""):
        if found in names:
            return str(found)
    return None


def _collateral(error: dict[str, Any] | None) -> bool:
    """A failure that a peer node's dead launcher explains: the rank's connections to the
    ranks that died with it broke or timed out, or it was killed by a signal from outside
    (its teardown), not a failure of its own (an exception, an OOM, a crash)."""
    if error is None:
        return True
    cause = error.get("cause")
    if cause in (failure.TIMEOUT, failure.NODE_LOST):
        return True
    if str(cause).startswith("signal ") \
            and failure.signal_of(error.get("exit_code")) in _TAKEN_DOWN:
        return True
    text = "\n".join([str(error.get("summary") or ""), *map(str, error.get("lines") or [])])
    return bool(_PEER_GONE.search(text))


def _lost_first(attempt: Attempt, reason: str | None, chosen: dict[str, Any] | None) -> bool:
    """A node's launcher died and another node's rank failed too: the launcher's death
    came first when the server recorded it before that rank failed (the stop it sent
    carries the time), or when the rank's failure is what a dead peer causes. A stalled
    or busy server may hear the collateral failure before it sees the launcher gone."""
    if reason == "lost" and chosen is not None:
        stop_at = ((attempt.control or {}).get("cancel") or {}).get("at")
        if stop_at is not None and float(stop_at) <= float(chosen.get("at") or 0.0):
            return True
    return _collateral(chosen)


def _lost_message(attempt: Attempt, message: str | None, node: str) -> str:
    for said in (attempt.message, message):
        if said and _named_node(said, [node]) == node and (
                "died" in said or "not heard from" in said):  # (server/silence.py's)
            return said
    return f"node launcher on {node} died"


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
    if lost and aborted and not ended and reason in (None, "lost"):
        # a launcher died and a rank of another node failed: the one that came first wins
        earliest = failure.first([n.raw.get("error") for n in status.nodes
                                  if n.state in ("failed", "timeout")])
        if _lost_first(attempt, reason, earliest):
            dead = _named_node(attempt.message, [names[n.node_rank] for n in lost]) \
                or names[lost[0].node_rank]
            said = _lost_message(attempt, message, dead)
            return failure.record(failure.NODE_LOST, node=dead, summary=said,
                                  what="node"), _with_cause(said, failure.NODE_LOST)
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
