"""azureml.train.hyperdrive.sampling: how a parameter space is sampled. ``{"--lr": ...}``
keys are passed to the entry script as ``--lr VALUE``, as HyperDrive did."""

from __future__ import annotations

from typing import Any

from batchyard.compat.azureml.exceptions import UserErrorException


class HyperParameterSampling:
    _algorithm = "random"

    def __init__(self, parameter_space: dict[str, Any],
                 properties: dict[str, Any] | None = None) -> None:
        if not isinstance(parameter_space, dict) or not parameter_space:
            raise UserErrorException(f"{type(self).__name__}: parameter_space must be a "
                                     "non-empty dict of name -> choice(...), uniform(...), ...")
        self._parameter_space = dict(parameter_space)
        self._properties = dict(properties or {})

    @property
    def parameter_space(self) -> dict[str, Any]:
        return dict(self._parameter_space)

    def _to_spec(self) -> dict[str, Any]:
        sampling: dict[str, Any] = {"type": self._algorithm}
        seed = self._properties.get("seed")
        if seed is not None:
            sampling["seed"] = int(seed)
        return sampling


class RandomParameterSampling(HyperParameterSampling):
    _algorithm = "random"


class GridParameterSampling(HyperParameterSampling):
    _algorithm = "grid"

    def __init__(self, parameter_space: dict[str, Any]) -> None:
        super().__init__(parameter_space)


class BayesianParameterSampling(HyperParameterSampling):
    _algorithm = "bayesian"

    def __init__(self, parameter_space: dict[str, Any]) -> None:
        super().__init__(parameter_space)


__all__ = ["BayesianParameterSampling", "GridParameterSampling", "HyperParameterSampling",
           "RandomParameterSampling"]
