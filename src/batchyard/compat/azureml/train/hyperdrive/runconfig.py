"""azureml.train.hyperdrive.runconfig: ``HyperDriveConfig`` (an estimator or ScriptRunConfig,
a parameter sampling, a primary metric and goal, limits, a policy) and ``PrimaryMetricGoal``.
``experiment.submit(hd_config)`` creates a batchyard sweep whose trials are the estimator's
job with sampled ``--name value`` arguments appended, and returns a HyperDriveRun."""

from __future__ import annotations

import uuid
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from batchyard import errors
from batchyard.compat.azureml.exceptions import UserErrorException
from batchyard.compat.azureml.train.hyperdrive.policy import EarlyTerminationPolicy
from batchyard.compat.azureml.train.hyperdrive.sampling import HyperParameterSampling

if TYPE_CHECKING:
    from batchyard.compat.azureml.core.experiment import Experiment
    from batchyard.compat.azureml.train.hyperdrive.run import HyperDriveRun
    from batchyard.spec.sweep import SweepSpec


class PrimaryMetricGoal(Enum):
    MAXIMIZE = "MAXIMIZE"
    MINIMIZE = "MINIMIZE"

    @staticmethod
    def from_str(goal: str) -> PrimaryMetricGoal:
        return PrimaryMetricGoal(str(goal).upper())


class HyperDriveConfig:
    def __init__(self, hyperparameter_sampling: HyperParameterSampling,
                 primary_metric_name: str, primary_metric_goal: PrimaryMetricGoal | str,
                 max_total_runs: int, max_concurrent_runs: int | None = None,
                 max_duration_minutes: float = 10080,
                 policy: EarlyTerminationPolicy | None = None, estimator: Any = None,
                 run_config: Any = None, resume_from: Any = None,
                 resume_child_runs: Any = None, pipeline: Any = None,
                 debug_flag: Any = None, custom_run_id: str | None = None) -> None:
        if (estimator is None) == (run_config is None):
            raise UserErrorException("HyperDriveConfig: give run_config (a ScriptRunConfig) "
                                     "or estimator, one of them")
        for name, value in (("resume_from", resume_from),
                            ("resume_child_runs", resume_child_runs), ("pipeline", pipeline)):
            if value is not None:
                from batchyard.compat.azureml.exceptions import UnsupportedParameterError

                raise UnsupportedParameterError(name, "not available in batchyard",
                                                "HyperDriveConfig")
        if not isinstance(hyperparameter_sampling, HyperParameterSampling):
            raise UserErrorException("HyperDriveConfig: hyperparameter_sampling must be a "
                                     "RandomParameterSampling, GridParameterSampling or "
                                     "BayesianParameterSampling")
        self._sampling = hyperparameter_sampling
        self._primary_metric_name = primary_metric_name
        self._goal = primary_metric_goal if isinstance(primary_metric_goal, PrimaryMetricGoal) \
            else PrimaryMetricGoal.from_str(primary_metric_goal)
        self._max_total_runs = max_total_runs
        self._max_concurrent_runs = max_concurrent_runs
        self._max_duration_minutes = max_duration_minutes
        self._policy = policy
        self._run_config = run_config if run_config is not None else estimator
        self._custom_run_id = custom_run_id

    @property
    def estimator(self) -> Any:
        return self._run_config

    @property
    def run_config(self) -> Any:
        return self._run_config

    def _to_sweep(self, tags: dict[str, str] | None = None) -> tuple[SweepSpec, str,
                                                                     str | None]:
        """(the sweep spec, the source directory, the compute target name)."""
        from batchyard.spec.sweep import SweepSpec

        submission = self._run_config._to_submission(tags)
        trial = submission.spec.model_dump(mode="json", exclude_none=True)
        trial["code"] = submission.source_directory
        data = {
            "search_space": self._sampling.parameter_space,
            "sampling": self._sampling._to_spec(),
            "objective": {"primary_metric": self._primary_metric_name,
                          "goal": self._goal.value.lower()},
            "limits": {"max_total_trials": self._max_total_runs,
                       "max_concurrent_trials": self._max_concurrent_runs,
                       "timeout": float(self._max_duration_minutes) * 60},
            "early_termination": self._policy._to_spec() if self._policy else None,
            "tags": dict(tags or {}), "trial": trial,
        }
        try:
            spec = SweepSpec.model_validate({k: v for k, v in data.items() if v is not None})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
                                 for e in exc.errors())
            raise UserErrorException(f"HyperDriveConfig: {problems}") from None
        return spec, submission.source_directory, submission.compute_target

    def _submit_to(self, experiment: Experiment, tags: dict[str, str] | None = None
                   ) -> HyperDriveRun:
        from batchyard.compat.azureml.train.hyperdrive.run import HyperDriveRun
        from batchyard.sdk.sweep import Sweep

        spec, _, target = self._to_sweep(tags)
        name = self._custom_run_id or f"HD_{uuid.uuid4().hex[:16]}"
        try:
            sweep = Sweep.create(spec, workspace=experiment.workspace.sdk,
                                 experiment=experiment.name, cluster=target, name=name,
                                 source_format="azureml-sdk")
        except errors.UserError as exc:
            raise UserErrorException(exc.message) from None
        return HyperDriveRun(experiment, sweep.name, _sweep=sweep)


HyperDriveRunConfig = HyperDriveConfig

__all__ = ["HyperDriveConfig", "HyperDriveRunConfig", "PrimaryMetricGoal"]
