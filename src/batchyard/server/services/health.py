"""The server's half of the periodic health checks (cluster ``health_check_every``): which
node is due a check, and what a node's result does to it (``node/healthcheck.py`` measures).

- A failing idle node becomes ``unusable`` with the measured reason ("health check: ...").
- An unusable node whose trouble a check can see again (a failed health check, or a job's
  pre-flight) returns to ``idle`` after ``health_check_passes`` passes in a row.
- A node blamed by a job's pre-flight twice within a day is held: checks no longer bring it
  back, only ``cluster node enable`` (flaky hardware passes a quick check and fails the next
  job, so the second time a person looks at it).
What a node keeps (``Node.health``): the last result, the passes in a row, the times of its
recent pre-flight failures and the hold."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from batchyard.server.context import kick_after_commit
from batchyard.server.services import common
from batchyard.store.models import Cluster, Node, now

PREFIX = "health check: "
PREFLIGHT = "pre-flight"
DEFAULT_PASSES = 3
DAY = 86400.0
HELD_NOTE = ("its second failed pre-flight within a day: kept out until "
             "`batchyard cluster node enable`")


def every(cluster: Cluster) -> float | None:
    value = (cluster.spec or {}).get("health_check_every")
    return float(value) if value else None


def passes_needed(cluster: Cluster) -> int:
    return int((cluster.spec or {}).get("health_check_passes") or DEFAULT_PASSES)


def held(node: Node) -> bool:
    return bool((node.health or {}).get("hold"))


def healable(node: Node) -> bool:
    """Unusable for a reason a passing check answers (not a failed setup task, not a hold)."""
    return (node.state == "unusable" and node.job_id is None and not held(node)
            and (node.reason or "").startswith((PREFIX, PREFLIGHT)))


def due(cluster: Cluster, node: Node, stamp: float) -> bool:
    period = every(cluster)
    if period is None or node.job_id is not None:
        return False
    if node.state != "idle" and not healable(node):
        return False
    last = float(((node.health or {}).get("last") or {}).get("at") or 0.0)
    return stamp - last >= period


def _last(result: dict[str, Any]) -> dict[str, Any]:
    found = result.get("checks")
    checks = [{str(k)[:64]: v[:500] if isinstance(v, str) else v for k, v in c.items()
               if isinstance(v, str | int | float | bool)}
              for c in (found if isinstance(found, list) else [])[:8] if isinstance(c, dict)]
    reason, took = result.get("reason"), result.get("took_s")
    number = (int, float)
    return {"at": now(),  # the server's clock paces the checks, not a node's
            "ok": result.get("ok") is True, "reason": str(reason)[:1000] if reason else None,
            "took_s": float(took) if isinstance(took, number) else None, "checks": checks}


def apply(session: Session, cluster: Cluster, node: Node, result: dict[str, Any]) -> None:
    """A node's check result: a node that took a job meanwhile only keeps the figures."""
    state = dict(node.health or {})
    last = _last(result)
    state["last"] = last
    if node.job_id is not None or node.state not in ("idle", "unusable"):
        node.health = state
        return
    if not last["ok"]:
        state["passes"] = 0
        reason = f"{PREFIX}{last['reason'] or 'failed'}"[:2000]
        if node.state == "idle":
            common.record(session, "node", node.id, "idle", "unusable", reason)
            node.state, node.reason, node.idle_since = "unusable", reason, None
        elif healable(node) and (node.reason or "").startswith(PREFIX):
            node.reason = reason  # the latest measurement
    elif healable(node):
        state["passes"] = int(state.get("passes") or 0) + 1
        need = passes_needed(cluster)
        if state["passes"] >= need:
            note = (f"passed {need} health check{'s' if need > 1 else ''} in a row "
                    f"(was: {node.reason})")
            common.record(session, "node", node.id, "unusable", "idle", note[:2000])
            node.state, node.reason, node.idle_since = "idle", None, now()
            state["passes"] = 0
            kick_after_commit(session)  # queued jobs may take it now
    node.health = state


def preflight_failed(node: Node, stamp: float) -> bool:
    """Count a pre-flight blamed on ``node``; True when it is its second within a day (the
    node is held until an admin enables it)."""
    state = dict(node.health or {})
    times = [float(t) for t in state.get("preflight_failures") or [] if stamp - float(t) < DAY]
    times.append(stamp)
    state["preflight_failures"] = times[-10:]
    state["passes"] = 0
    if len(times) >= 2:
        state["hold"] = True
    node.health = state
    return len(times) >= 2


def enabled(node: Node) -> None:
    """``cluster node enable``: an admin's word lifts a hold and forgets the pre-flight
    failures behind it; a node enabled after one failure keeps that one for the day (a
    second still holds it)."""
    if node.health:
        drop = ("hold", "preflight_failures", "passes") if held(node) else ("passes",)
        node.health = {k: v for k, v in node.health.items() if k not in drop}


def view(node: Node) -> dict[str, Any] | None:
    state = node.health or {}
    if not state:
        return None
    out: dict[str, Any] = {"passes": int(state.get("passes") or 0), "held": held(node)}
    if state.get("last"):
        out["last"] = state["last"]
    if state.get("preflight_failures"):
        out["preflight_failures"] = list(state["preflight_failures"])
    return out
