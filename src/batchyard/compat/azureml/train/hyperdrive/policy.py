"""azureml.train.hyperdrive.policy: early termination of poor runs. Each becomes the
``early_termination`` block of batchyard's sweep spec; a run it stops ends ``Canceled``
saying "stopped early by the bandit policy at step N" (or the median stopping / truncation
selection policy)."""

from __future__ import annotations

from typing import Any


class EarlyTerminationPolicy:
    _type = "none"

    def __init__(self, evaluation_interval: int = 1, delay_evaluation: int = 0) -> None:
        self.evaluation_interval = evaluation_interval
        self.delay_evaluation = delay_evaluation

    def _to_spec(self) -> dict[str, Any] | None:
        return {"type": self._type, "evaluation_interval": self.evaluation_interval,
                "delay_evaluation": self.delay_evaluation}


class BanditPolicy(EarlyTerminationPolicy):
    _type = "bandit"

    def __init__(self, evaluation_interval: int = 1, slack_factor: float | None = None,
                 slack_amount: float | None = None, delay_evaluation: int = 0) -> None:
        super().__init__(evaluation_interval, delay_evaluation)
        self.slack_factor = slack_factor
        self.slack_amount = slack_amount

    def _to_spec(self) -> dict[str, Any] | None:
        spec = super()._to_spec() or {}
        spec.update({k: v for k, v in (("slack_factor", self.slack_factor),
                                       ("slack_amount", self.slack_amount)) if v is not None})
        return spec


class MedianStoppingPolicy(EarlyTerminationPolicy):
    _type = "median_stopping"


class TruncationSelectionPolicy(EarlyTerminationPolicy):
    _type = "truncation_selection"

    def __init__(self, truncation_percentage: int, evaluation_interval: int = 1,
                 delay_evaluation: int = 0, exclude_finished_jobs: bool = False) -> None:
        super().__init__(evaluation_interval, delay_evaluation)
        self.truncation_percentage = truncation_percentage
        self.exclude_finished_jobs = exclude_finished_jobs

    def _to_spec(self) -> dict[str, Any] | None:
        return {**(super()._to_spec() or {}),
                "truncation_percentage": self.truncation_percentage}


class NoTerminationPolicy(EarlyTerminationPolicy):
    def __init__(self) -> None:
        super().__init__()

    def _to_spec(self) -> dict[str, Any] | None:
        return None


__all__ = ["BanditPolicy", "EarlyTerminationPolicy", "MedianStoppingPolicy",
           "NoTerminationPolicy", "TruncationSelectionPolicy"]
