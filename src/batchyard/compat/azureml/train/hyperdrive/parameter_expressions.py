"""azureml.train.hyperdrive.parameter_expressions: the distributions of a parameter space,
with Azure ML's meaning (``loguniform(a, b)`` is ``exp(uniform(a, b))``: the bounds are
exponents). Each returns the search-space entry batchyard's sweep spec takes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def choice(*options: Any) -> dict[str, Any]:
    """``choice(16, 32)``, ``choice([16, 32])`` or ``choice(range(1, 5))``."""
    values: list[Any] = list(options)
    if len(options) == 1 and isinstance(options[0], Iterable) \
            and not isinstance(options[0], str | bytes):
        values = list(options[0])
    return {"type": "choice", "values": values}


def randint(upper: int) -> dict[str, Any]:
    return {"type": "randint", "upper": int(upper)}


def uniform(min_value: float, max_value: float) -> dict[str, Any]:
    return {"type": "uniform", "min_value": min_value, "max_value": max_value}


def quniform(min_value: float, max_value: float, q: float) -> dict[str, Any]:
    return {"type": "quniform", "min_value": min_value, "max_value": max_value, "q": q}


def loguniform(min_value: float, max_value: float) -> dict[str, Any]:
    return {"type": "loguniform", "min_value": min_value, "max_value": max_value}


def qloguniform(min_value: float, max_value: float, q: float) -> dict[str, Any]:
    return {"type": "qloguniform", "min_value": min_value, "max_value": max_value, "q": q}


def normal(mu: float, sigma: float) -> dict[str, Any]:
    return {"type": "normal", "mu": mu, "sigma": sigma}


def qnormal(mu: float, sigma: float, q: float) -> dict[str, Any]:
    return {"type": "qnormal", "mu": mu, "sigma": sigma, "q": q}


def lognormal(mu: float, sigma: float) -> dict[str, Any]:
    return {"type": "lognormal", "mu": mu, "sigma": sigma}


def qlognormal(mu: float, sigma: float, q: float) -> dict[str, Any]:
    return {"type": "qlognormal", "mu": mu, "sigma": sigma, "q": q}


__all__ = ["choice", "lognormal", "loguniform", "normal", "qlognormal", "qloguniform",
           "qnormal", "quniform", "randint", "uniform"]
