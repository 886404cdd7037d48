"""The next trial's hyperparameters, from the search space and the trials so far.

Each call builds a throw-away in-memory Optuna study from the history the store holds, so
the driver keeps no sampler state in memory: a restarted server samples exactly as the
killed one would have. Random and TPE samplers are seeded with (seed, trial index), which
makes trial N's draw the same whenever it is made; grid sampling walks the grid in order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchyard.sweeps import space as sp

ALGORITHMS = ("random", "grid", "bayesian")


@dataclass(frozen=True)
class Past:
    """A trial already made: its sampler draws, and its objective once it has one
    (``failed``: it ended without one)."""

    raw: Mapping[str, Any]
    objective: float | None = None
    failed: bool = False


def next_draw(algorithm: str, space: Mapping[str, Mapping[str, Any]], index: int,
              history: Sequence[Past], *, goal: str = "maximize",
              seed: int | None = None) -> dict[str, Any] | None:
    """The sampler draws of trial ``index`` (0-based), or None when the space is used up
    (grid only)."""
    if algorithm == "grid":
        for position, draw in enumerate(sp.grid(space)):
            if position == index:
                return draw
        return None
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    trial_seed = ((seed if seed is not None else 0) * 1_000_003 + index) % (2**32)
    if algorithm == "random":
        sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=trial_seed)
    elif algorithm == "bayesian":
        sampler = optuna.samplers.TPESampler(seed=trial_seed, n_startup_trials=4,
                                             constant_liar=True)
    else:
        raise ValueError(f"sampling: unknown algorithm {algorithm!r}; one of "
                         f"{', '.join(ALGORITHMS)}")
    dists = {name: sp.sampler_distribution(param) for name, param in space.items()}
    study = optuna.create_study(
        direction="minimize" if goal == "minimize" else "maximize", sampler=sampler)
    if algorithm == "bayesian":  # random draws need no history: they are independent
        from optuna.trial import TrialState, create_trial

        for past in history:
            params = {k: v for k, v in past.raw.items() if k in dists}
            if set(params) != set(dists):
                continue  # a trial of an older search space
            if past.objective is not None:
                study.add_trial(create_trial(params=params, distributions=dists,
                                             value=past.objective))
            elif past.failed:
                study.add_trial(create_trial(params=params, distributions=dists,
                                             state=TrialState.FAIL))
            else:
                study.add_trial(create_trial(params=params, distributions=dists,
                                             state=TrialState.RUNNING))
    trial = study.ask(dists)
    return dict(trial.params)
