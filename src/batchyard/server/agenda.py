"""When the reconciler looks at each active attempt, and when it runs a scheduling pass.

An attempt is looked at (a transaction under the control lock, ``Reconciler._follow``):

* when an event marks it (server/followups.py: a report that says something new, a change
  of its control, a terminate);
* when a timer of its own is due (``due``): a look at its backend's queue, the silence
  allowed to launchers after a takeover, the wait for a hung gang's stack dumps; and at
  once again after a look that changed it (what it set in motion may be done already);
* when its backend, asked without the database every ``LIVENESS_EVERY`` seconds, says
  something else about its launchers than at the last look (a launcher killed);
* every ``SWEEP_EVERY`` seconds anyway, spread over the attempts: a change that came by a
  path nobody marked is seen that late at worst.

A scheduling pass runs on a kick (a submit, a resize, nodes freed by an attempt that ended)
and otherwise as often as time alone can change its answer (``schedule_in``)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("batchyard.reconciler")

LIVENESS_EVERY = 0.5  # s between asking backends whether launchers live (pids, Ray actors)
SWEEP_EVERY = 10.0  # s: every active attempt is looked at at least this often
SWEEP_SPREAD = 0.2  # +/- this share of SWEEP_EVERY, so the looks do not come in one burst
QUIET_TICK = 5.0  # s between scheduling passes with nothing that time alone changes


@dataclass
class Watched:
    """What the liveness check needs of an attempt: no database."""

    backend: Any
    handle: dict[str, Any]
    alive: list[bool | None]


@dataclass
class Agenda:
    due: dict[int, float] = field(default_factory=dict)  # attempt id -> monotonic time
    watched: dict[int, Watched] = field(default_factory=dict)
    swept_at: float = float("-inf")  # the last listing of every active attempt
    live_at: float = float("-inf")  # the last liveness check
    schedule_at: float = float("-inf")  # the next scheduling pass, without a kick

    def forget(self) -> None:
        """Another server leads: it keeps its own agenda."""
        self.due.clear()
        self.watched.clear()
        self.swept_at = self.live_at = self.schedule_at = float("-inf")

    def sweep_due(self, clock: float) -> bool:
        return clock - self.swept_at >= SWEEP_EVERY

    def listed(self, clock: float, active: list[int]) -> None:
        """Every active attempt, as the database lists them now: an unknown one is looked at
        now, an ended one forgotten."""
        self.swept_at = clock
        alive = set(active)
        for gone in [a for a in self.due if a not in alive]:
            self.end(gone)
        for attempt_id in active:
            self.due.setdefault(attempt_id, clock)

    def pick(self, clock: float, marked: set[int]) -> list[int]:
        """The attempts to look at now: the marked ones and those whose time has come."""
        return sorted(marked | {a for a, at in self.due.items() if at <= clock})

    def looked(self, attempt_id: int, clock: float, every: float | None,
               watched: Watched | None) -> None:
        """After a look at an active attempt: the next one is due in ``every`` seconds, or
        at the latest at its next sweep."""
        sweep = SWEEP_EVERY * (1.0 + SWEEP_SPREAD * (2.0 * random.random() - 1.0))
        self.due[attempt_id] = clock + min(sweep, every if every is not None else sweep)
        if watched is None:
            self.watched.pop(attempt_id, None)
        else:
            self.watched[attempt_id] = watched

    def end(self, attempt_id: int) -> None:
        self.due.pop(attempt_id, None)
        self.watched.pop(attempt_id, None)

    def liveness(self, clock: float) -> set[int]:
        """The attempts whose backend says something new about their launchers."""
        if clock - self.live_at < LIVENESS_EVERY:
            return set()
        self.live_at = clock
        changed = set()
        for attempt_id, seen in list(self.watched.items()):
            try:
                alive = seen.backend.alive(seen.handle)
            except Exception as exc:  # a look under the control lock says more
                log.debug("attempt %s: liveness unknown: %s", attempt_id, exc)
                continue
            if alive != seen.alive:
                changed.add(attempt_id)
        return changed

    def next_in(self, clock: float) -> float:
        """Seconds until something on the agenda is due."""
        times = [self.schedule_at, self.swept_at + SWEEP_EVERY, *self.due.values()]
        if self.watched:
            times.append(self.live_at + LIVENESS_EVERY)
        return max(0.0, min(times) - clock)
