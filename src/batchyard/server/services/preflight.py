"""The server's half of a gang's pre-flight (``node/preflight.py`` measures): once every node
has reported its checks, decide who is to blame, mark those nodes unusable with the measured
reason and place the gang again without them (the attempt ends like a preemption: no retry is
used up), or let the gang go on.

Who is to blame when A cannot reach B (a pair is broken when either direction fails):
- a node whose GPU check failed, always;
- otherwise the nodes with the most broken links are set aside, again and again, until the
  rest reach each other both ways; if the rest is a strict majority of the gang, the nodes
  set aside are to blame (with 3+ nodes: a node that fails with every peer);
- else (2 nodes, or an even split), a node that none of its peers can reach at its published
  address while it reaches all of them is to blame: an unroutable address and an inbound
  firewall are what break in practice, and such a node dials out fine;
- else nobody is: the attempt fails with the measured links, rather than guessing."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from batchyard.backends.base import GangStatus
from batchyard.server.services import common
from batchyard.server.services.channel import update_control
from batchyard.server.services.health import HELD_NOTE, preflight_failed
from batchyard.server.services.interrupts import request_stop
from batchyard.store.models import Attempt, Job, Node, now

SLOW_FACTOR = 10.0  # a pair this much slower than the gang's median is noted, not blamed


def _reach(reports: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    """(from, to) -> what the dialling node saw."""
    links: dict[tuple[int, int], dict[str, Any]] = {}
    for rank, report in enumerate(reports):
        for link in report.get("links") or []:
            links[(rank, int(link["peer_rank"]))] = link
    return links


def _ok(links: dict[tuple[int, int], dict[str, Any]], a: int, b: int) -> bool:
    return bool(links.get((a, b), {}).get("ok"))


def _errors(found: list[dict[str, Any]]) -> str:
    seen: list[str] = []
    for link in found:
        error = str(link.get("error") or "not measured")
        if error not in seen:
            seen.append(error)
    return ", ".join(seen)


def _network_blame(candidates: list[int],
                   links: dict[tuple[int, int], dict[str, Any]]) -> tuple[list[int], bool]:
    """(blamed node ranks, whether any link among the candidates is broken)."""
    def broken(a: int, b: int) -> bool:
        return not _ok(links, a, b) or not _ok(links, b, a)

    alive, removed = set(candidates), []
    while True:
        counts = {x: sum(broken(x, p) for p in alive if p != x) for x in alive}
        worst = max(counts.values(), default=0)
        if worst == 0:
            break
        tied = sorted(x for x in alive if counts[x] == worst)
        alive -= set(tied)
        removed += tied
    if not removed:
        return [], False
    if 2 * len(alive) > len(candidates):
        return sorted(removed), True
    unreachable = [x for x in candidates
                   if all(not _ok(links, p, x) and _ok(links, x, p)
                          for p in candidates if p != x)]
    rest = [x for x in candidates if x not in unreachable]
    if unreachable and rest and not any(broken(a, b) for a in rest for b in rest if a < b):
        return unreachable, True
    return [], True


def _why(x: int, names: list[str], candidates: list[int],
         links: dict[tuple[int, int], dict[str, Any]]) -> str:
    parts = []
    inbound = [p for p in candidates if p != x and not _ok(links, p, x)]
    if inbound:
        addr = next((links[(p, x)].get("addr") for p in inbound if (p, x) in links), names[x])
        parts.append(f"cannot reach {addr} from {', '.join(names[p] for p in inbound)} "
                     f"({_errors([links.get((p, x), {}) for p in inbound])})")
    outbound = [p for p in candidates if p != x and not _ok(links, x, p)]
    if outbound:
        targets = ", ".join(f"{names[p]} ({links.get((x, p), {}).get('addr', '?')})"
                            for p in outbound)
        parts.append(f"{names[x]} cannot reach {targets} "
                     f"({_errors([links.get((x, p), {}) for p in outbound])})")
    return "; ".join(parts)


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


def _summary(names: list[str], reports: list[dict[str, Any]],
             links: dict[tuple[int, int], dict[str, Any]]) -> str:
    from batchyard.diagnose.report import flag_slow

    took = max(float(r.get("took_s") or 0) for r in reports)
    parts = []
    pairs = [{"a": names[a], "b": names[b], "latency_us": link["latency_us"],
              "bandwidth_MBps": link["bandwidth_MBps"]}
             for (a, b), link in sorted(links.items()) if "bandwidth_MBps" in link]
    if any("links" in r for r in reports):
        text = f"network: {len(pairs)} pair(s) measured"
        if pairs:
            lat = [p["latency_us"] for p in pairs]
            bw = [p["bandwidth_MBps"] for p in pairs]
            text += f", latency {_span(lat)} us, bandwidth {_span(bw)} MB/s"
            slow = flag_slow({"nodes": names, "pairs": pairs}, SLOW_FACTOR)
            if slow:
                text += "; slow: " + "; ".join(f"{s['node']} ({', '.join(s['reasons'])})"
                                               for s in slow)
        parts.append(text)
    gpus = [f"{names[i]}: {r['gpu'].get('message')}" for i, r in enumerate(reports)
            if isinstance(r.get("gpu"), dict)]
    if gpus:
        parts.append("gpu: " + ", ".join(gpus))
    nodes = f"{len(names)} node{'' if len(names) == 1 else 's'}"
    return f"pre-flight passed on {nodes} in {took:g} s ({'; '.join(parts)})"


def verdict(names: list[str], reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Pure: every node's report in, the decision out: ``ok``, ``message`` and ``blamed``
    (node name -> the measured reason)."""
    n = len(names)
    links = _reach(reports)
    blamed: dict[str, str] = {}
    for rank, report in enumerate(reports):
        gpu = report.get("gpu")
        if isinstance(gpu, dict) and not gpu.get("ok"):
            blamed[names[rank]] = f"unhealthy GPU: {gpu.get('message')}"
    candidates = [r for r in range(n) if names[r] not in blamed]
    network = any("links" in r for r in reports)
    found, broken = _network_blame(candidates, links) if network else ([], False)
    for rank in found:
        blamed[names[rank]] = _why(rank, names, candidates, links)
    if blamed:
        detail = "; ".join(f"node {name} unusable: {why}" for name, why in blamed.items())
        return {"ok": False, "blamed": blamed, "message": f"pre-flight: {detail}"}
    if broken:
        pairs = [f"{names[a]} -> {names[b]}: {links.get((a, b), {}).get('error', 'not measured')}"
                 for a in candidates for b in candidates if a != b and not _ok(links, a, b)]
        return {"ok": False, "blamed": {}, "message": (
            "pre-flight: nodes of the gang cannot reach each other (" + "; ".join(pairs)
            + "), and the links do not tell which node is at fault: none is marked unusable")}
    return {"ok": True, "blamed": {}, "message": _summary(names, reports, links)}


def judge(session: Session, job: Job, attempt: Attempt, status: GangStatus,
          names: list[str]) -> None:
    """Called on each pass over a starting attempt: acts once every node has reported."""
    control = attempt.control or {}
    if control.get("preflight") or attempt.cancel_reason is not None:
        return
    reports = [n.raw.get("preflight") for n in status.nodes]
    if not reports or not all(isinstance(r, dict) for r in reports):
        return
    found = verdict(names, [dict(r) for r in reports if isinstance(r, dict)])
    update_control(attempt, preflight=found)
    message = str(found["message"])
    common.record(session, "job", job.id, job.state, job.state, message)
    if found["ok"]:
        return
    by_name = {node.name: node for node in (session.get(Node, i) for i in attempt.node_ids)
               if node is not None}
    for name, why in found["blamed"].items():
        node = by_name.get(name)
        if node is None:
            continue
        reason = f"pre-flight of job {job.name}: {why}"
        if preflight_failed(node, now()):
            reason = f"{reason} ({HELD_NOTE})"
        common.record(session, "node", node.id, node.state, "unusable", reason)
        node.state, node.reason = "unusable", reason[:2000]
    if found["blamed"]:  # placed again on other nodes: not the job's fault, no retry used
        attempt.cancel_reason = "requeue"
        attempt.message = message
        request_stop(attempt, "preempted", message, 3.0)
        attempt.state = "stopping"
    else:
        request_stop(attempt, "failed", message, 3.0)
