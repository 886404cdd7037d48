"""Turning a probe result into the table users read, flagging slow nodes."""

from __future__ import annotations

import statistics
from typing import Any


def flag_slow(result: dict[str, Any], factor: float) -> list[dict[str, Any]]:
    """A node is slow when its median pair latency is more than ``factor`` times the median
    of all pairs, or its median bandwidth less than the median divided by ``factor``."""
    pairs = result.get("pairs") or []
    if not pairs:
        return []
    lat_all = statistics.median(p["latency_us"] for p in pairs)
    bw_all = statistics.median(p["bandwidth_MBps"] for p in pairs)
    flagged = []
    for node in result.get("nodes") or []:
        mine = [p for p in pairs if node in (p["a"], p["b"])]
        if not mine:
            continue
        lat = statistics.median(p["latency_us"] for p in mine)
        bw = statistics.median(p["bandwidth_MBps"] for p in mine)
        reasons = []
        if lat > factor * lat_all:
            reasons.append(f"latency {lat:.1f} us > {factor:g} x median {lat_all:.1f} us")
        if bw * factor < bw_all:
            reasons.append(f"bandwidth {bw:.0f} MB/s < median {bw_all:.0f} MB/s / {factor:g}")
        if reasons:
            flagged.append({"node": node, "reasons": reasons})
    return flagged
