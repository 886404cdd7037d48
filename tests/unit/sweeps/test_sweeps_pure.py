"""The pure sweep logic: distributions keep Azure ML's meaning, draws are repeatable per
trial index, grid walks every combination once, TPE learns from history, the policies stop
what AML's would, and substitution quotes for the shell and appends --name value."""

from __future__ import annotations

import math
import shlex

import pytest

from batchyard.sweeps import policies, substitute
from batchyard.sweeps import space as sp
from batchyard.sweeps.sampling import Past, next_draw

SPACE = {
    "lr": {"type": "loguniform", "min_value": -7, "max_value": -1},
    "bs": {"type": "choice", "values": [16, 32, 64]},
    "drop": {"type": "quniform", "min_value": 0, "max_value": 1, "q": 0.1},
    "m": {"type": "normal", "mu": 0.9, "sigma": 0.01},
    "w": {"type": "qlognormal", "mu": 0, "sigma": 1, "q": 0.5},
    "n": {"type": "randint", "upper": 5},
}


def test_random_draws_are_repeatable_and_in_range() -> None:
    seen = []
    for index in range(30):
        draw = next_draw("random", SPACE, index, [], seed=3)
        assert draw == next_draw("random", SPACE, index, [Past({"x": 1})], seed=3)
        v = sp.values_of(SPACE, draw)
        assert math.exp(-7) <= v["lr"] <= math.exp(-1)
        assert v["bs"] in (16, 32, 64) and v["n"] in range(5)
        assert 0 <= v["drop"] <= 1 and round(v["drop"] * 10, 9).is_integer()
        assert v["w"] >= 0 and round(v["w"] / 0.5, 9).is_integer()
        seen.append(v["lr"])
    assert len(set(seen)) == 30
    assert next_draw("random", SPACE, 0, [], seed=4) != next_draw("random", SPACE, 0, [],
                                                                   seed=3)


def test_grid_covers_every_combination_once_then_ends() -> None:
    space = {"a": {"type": "choice", "values": ["x", "y"]}, "b": {"type": "randint",
                                                                   "upper": 3}}
    draws = [next_draw("grid", space, i, []) for i in range(6)]
    values = {tuple(sp.values_of(space, d).values()) for d in draws if d is not None}
    assert len(values) == 6 and sp.grid_size(space) == 6
    assert next_draw("grid", space, 6, []) is None
    with pytest.raises(ValueError, match="grid sampling takes choice"):
        next(sp.grid({"lr": {"type": "uniform", "min_value": 0, "max_value": 1}}))


def test_bayesian_moves_toward_the_good_region() -> None:
    space = {"x": {"type": "uniform", "min_value": 0, "max_value": 10}}
    history: list[Past] = []
    for index in range(30):
        draw = next_draw("bayesian", space, index, history, goal="minimize", seed=0)
        assert draw is not None
        history.append(Past(draw, objective=(draw["x"] - 7) ** 2))
    late = [p.raw["x"] for p in history[-10:]]
    assert sum(abs(x - 7) for x in late) / len(late) < 2.0, late


def test_bandit_slack_factor_and_amount() -> None:
    series = {0: {1: 0.9, 2: 0.95}, 1: {1: 0.5, 2: 0.7}, 2: {1: 0.85}}
    bandit = {"type": "bandit", "slack_factor": 0.2, "evaluation_interval": 1,
              "delay_evaluation": 0}
    assert policies.should_stop(bandit, 1, series, 2, "maximize")  # 0.7 < 0.95 / 1.2
    assert not policies.should_stop(bandit, 2, series, 1, "maximize")  # 0.85 >= 0.9 / 1.2
    assert not policies.should_stop(bandit, 0, series, 2, "maximize")  # the best itself
    amount = {"type": "bandit", "slack_amount": 0.1}
    assert policies.should_stop(amount, 2, {0: {1: 0.1}, 2: {1: 0.25}}, 1, "minimize")
    delayed = {**bandit, "delay_evaluation": 2}
    assert not policies.should_stop(delayed, 1, series, 1, "maximize")
    spaced = {**bandit, "evaluation_interval": 2}
    assert not policies.should_stop(spaced, 1, {0: {3: 1.0}, 1: {3: 0.1}}, 3, "maximize")
    assert policies.stop_reason(bandit, 2) == "stopped early by the bandit policy at step 2"


def test_median_stopping_and_truncation_selection() -> None:
    median = {"type": "median_stopping", "evaluation_interval": 1, "delay_evaluation": 0}
    series = {0: {1: 0.8, 2: 0.9}, 1: {1: 0.7, 2: 0.8}, 2: {1: 0.2, 2: 0.3}}
    assert policies.should_stop(median, 2, series, 2, "maximize")
    assert not policies.should_stop(median, 0, series, 2, "maximize")
    assert not policies.should_stop(median, 0, {0: {1: 0.1}}, 1, "maximize")  # alone
    trunc = {"type": "truncation_selection", "truncation_percentage": 34}
    assert policies.should_stop(trunc, 2, series, 2, "maximize")  # the worst third
    assert not policies.should_stop(trunc, 1, series, 2, "maximize")
    assert policies.should_stop(trunc, 0, series, 2, "minimize")
    assert not policies.should_stop({"type": "truncation_selection",
                                     "truncation_percentage": 5}, 2, series, 2, "maximize")
    assert policies.stop_reason(median, 4).endswith("median stopping policy at step 4")


def test_substitution_quotes_and_appends_options() -> None:
    params = {"lr": 0.001, "--momentum": 0.9, "name": "a b;rm"}
    line = substitute.apply({"command": "python t.py --lr ${{search_space.lr}} "
                                        "--tag ${{ search_space.name }}"}, params)["command"]
    assert shlex.split(line) == ["python", "t.py", "--lr", "0.001", "--tag", "a b;rm",
                                 "--momentum", "0.9"]
    argv = substitute.apply({"command": ["python", "t.py", "--x=${{search_space.lr}}"],
                             "env": {"M": "${{search_space.momentum}}"}}, params)
    assert argv["command"] == ["python", "t.py", "--x=0.001", "--momentum", "0.9"]
    assert argv["env"] == {"M": "0.9"}
    assert substitute.text_of(32.0) == "32.0" and substitute.text_of(True) == "True"
