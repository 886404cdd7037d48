"""Launchers a server that took over never hears from.

A server that takes the reconciler's lease (its leader died) or starts again follows the
attempts already running by their launchers' reports. A launcher that reports to an address
nobody answers at any more (a server that came back elsewhere and that it cannot find), or
that died with its node unseen, is alive as far as a pid check can tell, or unknowable: its job
stayed `running` for good, holding its nodes, and the queue behind it waited. So a launcher of
an attempt that was running before this server began to lead, not heard from (any report,
a heartbeat included: ``NodeReport.heard_at``) since, is lost once the cluster's heartbeat
timeout has passed: its attempt is stopped, failed or requeued (as a lost node is) naming the
cause, and its nodes are freed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.states import LAUNCHER_TERMINAL
from batchyard.store.models import Attempt, NodeReport

DEFAULT_TIMEOUT = 30.0  # s, as an agent's heartbeat timeout (cluster spec heartbeat_timeout)


def timeout_of(cluster_spec: dict[str, Any]) -> float:
    return float(cluster_spec.get("heartbeat_timeout") or DEFAULT_TIMEOUT)


def silent_nodes(session: Session, attempt: Attempt, cluster_spec: dict[str, Any],
                 led_since: float | None, stamp: float,
                 names: list[str]) -> dict[int, str]:
    """node rank -> why, for the launchers of ``attempt`` this server has not heard from
    since it began to lead ``led_since``, once the timeout has passed."""
    if led_since is None or attempt.created_at >= led_since:
        return {}  # launched by this server: its launchers know where it is
    timeout = timeout_of(cluster_spec)
    if stamp - led_since < timeout:
        return {}
    found: dict[int, str] = {}
    for row in session.scalars(select(NodeReport).where(NodeReport.attempt_id == attempt.id)):
        if row.state in LAUNCHER_TERMINAL or (row.heard_at or 0.0) >= led_since:
            continue
        name = names[row.node_rank] if row.node_rank < len(names) else f"node {row.node_rank}"
        found[row.node_rank] = (
            f"node launcher on {name} lost: not heard from for {timeout:g}s since this server "
            "took over (it reported to a server that went away and found no other)")
    return found


def wait_left(attempt: Attempt, cluster_spec: dict[str, Any], led_since: float | None,
              stamp: float) -> float | None:
    """Seconds until ``silent_nodes`` may first name a launcher of ``attempt`` (None: it
    never will by time alone, or already may)."""
    if led_since is None or attempt.created_at >= led_since:
        return None
    left = led_since + timeout_of(cluster_spec) - stamp
    return left + 0.05 if left >= 0 else None
