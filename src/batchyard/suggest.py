"""The nearest known name to one that is not known ("did you mean Standard_D3_v2?"): for
clusters, jobs, experiments, workspaces, datastores, node sizes and job-file fields. Pure and
cheap (difflib on at most a few thousand names), so errors can always offer one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6  # difflib's ratio below which a name is not offered (node -> nodes is 0.89)
START_WEIGHT = 0.1  # typos come late more often than early: a shared start counts a little


def nearest(word: str, candidates: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    """The known name closest to ``word`` (case aside), or None when none is close: difflib's
    ratio, nudged towards names that start as ``word`` does (``Standard_D3`` is
    Standard_D3_v2, not the as-similar Standard_D8_v3; ``ND40rs`` is ND40rs_v2)."""
    by_lower: dict[str, str] = {}
    for name in candidates:
        by_lower.setdefault(str(name).lower(), str(name))
    wanted = word.lower()
    matcher = difflib.SequenceMatcher(b=wanted)
    best: tuple[float, str] | None = None
    for lower in by_lower:
        matcher.set_seq1(lower)
        if matcher.real_quick_ratio() < cutoff or matcher.quick_ratio() < cutoff:
            continue
        ratio = matcher.ratio()
        if ratio < cutoff:
            continue
        start = len(_common_start(lower, wanted)) / max(1, len(wanted))
        key = (ratio + START_WEIGHT * start, lower)
        if best is None or key[0] > best[0]:
            best = key
    return by_lower[best[1]] if best else None


def _common_start(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean NAME?"`` for the nearest name, else ``""``: to end a message."""
    hit = nearest(word, candidates)
    return f"; did you mean {hit}?" if hit else ""
