"""Early termination of poor trials from the metric they log, with Azure ML HyperDrive's
policies (``BanditPolicy``, ``MedianStoppingPolicy``, ``TruncationSelectionPolicy``).

A trial is judged at an *evaluation step*: a step it logged the primary metric at that is a
multiple of ``evaluation_interval`` and at least ``delay_evaluation``. Each trial's series is
``{step: value}`` (a value logged without a step counts as step 1, 2, ... in order). Peers
are compared at the same step, so a trial that started late is measured against what the
others had reached at that point of their training, not at their end.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

Series = Mapping[int, float]
LABELS = {"bandit": "bandit", "median_stopping": "median stopping",
          "truncation_selection": "truncation selection"}


def is_evaluation_step(policy: Mapping[str, Any], step: int) -> bool:
    interval = int(policy.get("evaluation_interval") or 1)
    delay = int(policy.get("delay_evaluation") or 0)
    return step >= delay and step % interval == 0


def _better(a: float, b: float, maximize: bool) -> bool:
    return a > b if maximize else a < b


def should_stop(policy: Mapping[str, Any] | None, trial: int, series: Mapping[int, Series],
                step: int, goal: str) -> bool:
    """Whether ``trial`` (a key of ``series``, which holds every trial's series, itself
    included) is stopped at ``step`` by ``policy``."""
    if not policy or policy.get("type") in (None, "none"):
        return False
    mine = series.get(trial) or {}
    if step not in mine or not is_evaluation_step(policy, step):
        return False
    maximize = goal == "maximize"
    value = mine[step]
    at_step = {t: s[step] for t, s in series.items() if step in s and math.isfinite(s[step])}
    if not math.isfinite(value):
        return len(at_step) > 0  # a NaN or infinite objective is worse than any number
    kind = policy["type"]
    if kind == "bandit":
        best = max(at_step.values()) if maximize else min(at_step.values())
        return _outside_slack(value, best, policy, maximize)
    if kind == "median_stopping":
        averages = [statistics.fmean(v for k, v in s.items() if k <= step)
                    for t, s in series.items() if t != trial and step in s]
        if not averages:
            return False
        best_so_far = (max if maximize else min)(v for k, v in mine.items() if k <= step)
        return _better(statistics.median(averages), best_so_far, maximize)
    if kind == "truncation_selection":
        percent = float(policy.get("truncation_percentage") or 5)
        cut = math.floor(len(at_step) * percent / 100)
        if cut < 1:
            return False
        ranked = sorted(at_step.items(), key=lambda kv: (kv[1], -kv[0]), reverse=maximize)
        return trial in {t for t, _ in ranked[-cut:]}
    raise ValueError(f"early_termination.type: unknown policy {kind!r}")


def _outside_slack(value: float, best: float, policy: Mapping[str, Any],
                   maximize: bool) -> bool:
    """AML's rule: with slack_factor f, a maximized metric must reach best / (1 + f) and a
    minimized one stay under best * (1 + f); with slack_amount a, best - a / best + a."""
    factor, amount = policy.get("slack_factor"), policy.get("slack_amount")
    if factor is not None:
        bound = best / (1 + float(factor)) if maximize else best * (1 + float(factor))
    else:
        bound = best - float(amount or 0) if maximize else best + float(amount or 0)
    return value < bound if maximize else value > bound


def stop_reason(policy: Mapping[str, Any], step: int) -> str:
    """What a stopped trial's job ends with: 'stopped early by the bandit policy at step 3'."""
    return f"stopped early by the {LABELS.get(policy['type'], policy['type'])} policy at " \
        f"step {step}"
