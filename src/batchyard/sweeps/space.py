"""Search-space distributions with Azure ML's meaning (v1 ``parameter_expressions`` and the v2
``search_space`` YAML), mapped onto what a sampler draws.

Optuna's samplers draw in a *sampler space* that this module chooses per distribution, and a
transform turns a draw into the value a trial gets. That keeps AML's semantics exact where
Optuna has no such distribution: ``loguniform(a, b)`` is ``exp(uniform(a, b))`` (bounds are
exponents, as in AML), ``quniform`` rounds to a multiple of ``q`` after drawing, and the
normal family draws a uniform quantile and maps it through the inverse normal CDF (Optuna
has no unbounded distributions). The sampler then learns in its own space, which is the
space the transform is monotone in, so TPE's model stays meaningful.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

KINDS = ("choice", "uniform", "loguniform", "quniform", "qloguniform", "normal", "lognormal",
         "qnormal", "qlognormal", "randint")
_EPS = 1e-12
Value = Any  # what a trial gets: a number, or a choice's value (str, int, float, bool)


def sampler_distribution(param: Mapping[str, Any]) -> BaseDistribution:
    """The Optuna distribution a sampler draws ``param`` from (see the module's note)."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    kind = param["type"]
    if kind == "choice":
        return CategoricalDistribution(list(range(len(param["values"]))))
    if kind == "randint":
        return IntDistribution(0, int(param["upper"]) - 1)
    if kind in ("uniform", "quniform"):
        return FloatDistribution(float(param["min_value"]), float(param["max_value"]))
    if kind in ("loguniform", "qloguniform"):  # the exponent is uniform
        return FloatDistribution(float(param["min_value"]), float(param["max_value"]))
    if kind in ("normal", "lognormal", "qnormal", "qlognormal"):
        return FloatDistribution(_EPS, 1 - _EPS)  # a quantile
    raise ValueError(f"unknown distribution type {kind!r}")


def _round_to(value: float, q: float) -> float:
    """round(value / q) * q, as AML's q-distributions; 12 digits kept so that 3 x 0.1 reads
    0.3 in a command line, not 0.30000000000000004."""
    return round(round(value / q) * q, 12)


def to_value(param: Mapping[str, Any], raw: Any) -> Value:
    """The value a trial gets for the sampler's draw ``raw``."""
    kind = param["type"]
    if kind == "choice":
        return param["values"][int(raw)]
    if kind == "randint":
        return int(raw)
    x = float(raw)
    if kind == "uniform":
        return x
    if kind == "quniform":
        return _round_to(x, float(param["q"]))
    if kind == "loguniform":
        return math.exp(x)
    if kind == "qloguniform":
        return _round_to(math.exp(x), float(param["q"]))
    normal = NormalDist(float(param["mu"]), float(param["sigma"])).inv_cdf(
        min(max(x, _EPS), 1 - _EPS))
    if kind == "normal":
        return normal
    if kind == "qnormal":
        return _round_to(normal, float(param["q"]))
    if kind == "lognormal":
        return math.exp(normal)
    return _round_to(math.exp(normal), float(param["q"]))  # qlognormal


def grid(space: Mapping[str, Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every combination, in a fixed order (the keys' order, last key fastest), as sampler
    draws. Grid sampling takes ``choice`` and ``randint`` only, as AML's does (randint: each
    integer below ``upper``)."""
    names = list(space)
    axes: list[range] = []
    for name in names:
        param = space[name]
        if param["type"] == "choice":
            axes.append(range(len(param["values"])))
        elif param["type"] == "randint":
            axes.append(range(int(param["upper"])))
        else:
            raise ValueError(f"search_space.{name}: grid sampling takes choice (and randint) "
                             f"only, not {param['type']}")
    for combo in itertools.product(*axes):
        yield dict(zip(names, combo, strict=True))


def grid_size(space: Mapping[str, Mapping[str, Any]]) -> int:
    size = 1
    for param in space.values():
        size *= len(param["values"]) if param["type"] == "choice" else int(param["upper"])
    return size


def values_of(space: Mapping[str, Mapping[str, Any]], raw: Mapping[str, Any]) -> dict[str, Any]:
    return {name: to_value(space[name], raw[name]) for name in space}
