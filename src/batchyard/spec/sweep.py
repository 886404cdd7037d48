"""The sweep spec: a trial job template, a search space, a sampling algorithm, an objective,
limits and an early-termination policy, validated once, whichever format it came in:

* native YAML: a job file with a ``sweep:`` block (the job fields are the trial);
* AML v2 ``type: sweep`` YAML (``spec.sweep_aml``);
* AML v1 ``HyperDriveConfig`` (``compat.azureml.train.hyperdrive``), which builds it.

Distribution parameters keep AML's meaning (``loguniform`` bounds are exponents, as in
``exp(uniform(min, max))``; see ``sweeps.space``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from batchyard.errors import SpecError
from batchyard.spec.base import SpecModel
from batchyard.spec.documents import is_sweep_document
from batchyard.spec.durations import parse_duration
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import NAME_RE, JobSpec

SWEEP_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,55}$"  # room for _<trial index> in job names
PARAM_RE = r"^-{0,2}[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
MAX_TRIALS = 10000
Scalar = str | int | float | bool

_NEEDS: dict[str, tuple[str, ...]] = {
    "choice": ("values",), "uniform": ("min_value", "max_value"),
    "loguniform": ("min_value", "max_value"), "quniform": ("min_value", "max_value", "q"),
    "qloguniform": ("min_value", "max_value", "q"), "normal": ("mu", "sigma"),
    "lognormal": ("mu", "sigma"), "qnormal": ("mu", "sigma", "q"),
    "qlognormal": ("mu", "sigma", "q"), "randint": ("upper",),
}
_FIELDS = ("values", "min_value", "max_value", "q", "mu", "sigma", "upper")


class Param(SpecModel):
    """One hyperparameter's distribution (AML v2 search_space entry)."""

    type: Literal["choice", "uniform", "loguniform", "quniform", "qloguniform", "normal",
                  "lognormal", "qnormal", "qlognormal", "randint"]
    values: list[Scalar] | None = Field(None, min_length=1, max_length=10000,
                                        description="choice: the values to choose from.")
    min_value: float | None = Field(None, description="uniform/quniform: the lower bound; "
                                    "loguniform/qloguniform: the lower bound's exponent.")
    max_value: float | None = None
    q: float | None = Field(None, gt=0, description="q-distributions: round to a multiple.")
    mu: float | None = None
    sigma: float | None = Field(None, gt=0)
    upper: int | None = Field(None, ge=1, le=2**31 - 1, description="randint: 0 <= x < upper.")

    @model_validator(mode="after")
    def _complete(self) -> Param:
        needs = _NEEDS[self.type]
        missing = [f for f in needs if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{self.type} needs {', '.join(missing)}")
        extra = [f for f in _FIELDS if f not in needs and getattr(self, f) is not None]
        if extra:
            raise ValueError(f"{self.type} takes {', '.join(needs)}, not {', '.join(extra)}")
        if self.min_value is not None and self.max_value is not None \
                and self.max_value <= self.min_value:
            raise ValueError(f"max_value {self.max_value:g} must be above min_value "
                             f"{self.min_value:g}")
        if self.type == "loguniform" and self.max_value is not None and self.max_value > 700:
            raise ValueError("loguniform bounds are exponents (exp(uniform(min, max))): "
                             f"max_value {self.max_value:g} overflows")
        return self


class Sampling(SpecModel):
    type: Literal["random", "grid", "bayesian"] = Field(
        "random", description="random, grid (choice/randint only: every combination) or "
        "bayesian (Optuna's TPE).")
    seed: int | None = Field(None, ge=0, le=2**31 - 1,
                             description="Makes the draws repeatable.")

    @model_validator(mode="before")
    @classmethod
    def _short(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = {"type": value}
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "rule"}  # AML's sobol rule
            if isinstance(value.get("type"), str):
                value["type"] = value["type"].lower()
        return value


class Objective(SpecModel):
    primary_metric: str = Field(min_length=1, max_length=255,
                                description="A metric the trials log (run.log, "
                                "batchyard.log_metric); its last value is the trial's.")
    goal: Literal["maximize", "minimize"]

    @field_validator("goal", mode="before")
    @classmethod
    def _goal(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.lower()
            return {"max": "maximize", "min": "minimize"}.get(value, value)
        return value


class SweepLimits(SpecModel):
    max_total_trials: int | None = Field(None, ge=1, le=MAX_TRIALS, description="Trials in "
                                         "all (grid: default, the grid's size).")
    max_concurrent_trials: int | None = Field(None, ge=1, le=MAX_TRIALS, description="Trials "
                                              "submitted at once (default: all).")
    timeout: float | None = Field(None, gt=0, description="The whole sweep, seconds or 2h: "
                                  "running trials are then stopped.")
    trial_timeout: float | None = Field(None, gt=0, description="Each trial's wall clock.")

    @field_validator("timeout", "trial_timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)


class Policy(SpecModel):
    """Early termination (AML HyperDrive's BanditPolicy, MedianStoppingPolicy,
    TruncationSelectionPolicy)."""

    type: Literal["bandit", "median_stopping", "truncation_selection", "none"]
    evaluation_interval: int = Field(1, ge=1, le=2**31 - 1)
    delay_evaluation: int = Field(0, ge=0, le=2**31 - 1)
    slack_factor: float | None = Field(None, gt=0)
    slack_amount: float | None = Field(None, gt=0)
    truncation_percentage: int | None = Field(None, ge=1, le=99)

    @model_validator(mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("type"), str):
            kind = value["type"].lower().replace("policy", "").strip("_")
            value = {**value, "type": {"median": "median_stopping", "truncation":
                                       "truncation_selection", "no_termination": "none",
                                       "notermination": "none"}.get(kind, kind)}
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        if self.type == "bandit" and (self.slack_factor is None) == (self.slack_amount is None):
            raise ValueError("bandit needs slack_factor or slack_amount (one of them)")
        if self.type != "bandit" and (self.slack_factor or self.slack_amount):
            raise ValueError("slack_factor and slack_amount apply to the bandit policy only")
        if self.type == "truncation_selection" and self.truncation_percentage is None:
            self.truncation_percentage = 5
        if self.type != "truncation_selection" and self.truncation_percentage is not None:
            raise ValueError("truncation_percentage applies to truncation_selection only")
        return self


class SweepSettings(SpecModel):
    """The ``sweep:`` block of a native job file."""

    search_space: dict[str, Param] = Field(min_length=1, max_length=100)
    sampling: Sampling = Field(default_factory=Sampling)
    objective: Objective
    limits: SweepLimits = Field(default_factory=SweepLimits)
    early_termination: Policy | None = None

    @field_validator("search_space", mode="before")
    @classmethod
    def _short_choice(cls, value: Any) -> Any:
        if isinstance(value, dict):  # lr: [0.1, 0.01] is a choice
            return {k: {"type": "choice", "values": v} if isinstance(v, list) else v
                    for k, v in value.items()}
        return value

    @field_validator("search_space")
    @classmethod
    def _param_names(cls, value: dict[str, Param]) -> dict[str, Param]:
        import re

        for key in value:
            if not re.match(PARAM_RE, key):
                raise ValueError(f"{key!r} is not a parameter name (letters, digits, _ . -; "
                                 "'--lr' to pass it as a --lr argument)")
        return value

    @model_validator(mode="after")
    def _limits(self) -> SweepSettings:
        from batchyard.sweeps.space import grid, grid_size

        if self.sampling.type == "grid":
            try:
                next(grid({k: p.model_dump() for k, p in self.search_space.items()}))
            except ValueError as exc:
                raise ValueError(str(exc)) from None
            size = grid_size({k: p.model_dump() for k, p in self.search_space.items()})
            self.limits.max_total_trials = min(self.limits.max_total_trials or size, size)
        elif self.limits.max_total_trials is None:
            raise ValueError(f"limits.max_total_trials: required with {self.sampling.type} "
                             "sampling")
        return self


class SweepSpec(SweepSettings):
    """A sweep as the server stores it."""

    name: str | None = Field(None, pattern=SWEEP_NAME_RE)
    experiment: str | None = Field(None, pattern=NAME_RE)
    cluster: str | None = Field(None, pattern=NAME_RE)
    description: str | None = Field(None, max_length=64 * 1024)
    tags: dict[str, str] = Field(default_factory=dict)
    trial: JobSpec

    @model_validator(mode="after")
    def _placeholders(self) -> SweepSpec:
        from batchyard.sweeps.substitute import lookup, placeholders, texts

        trial = self.trial.model_dump(mode="json", exclude_none=True)
        for key in sorted(placeholders(texts(trial))):
            try:
                lookup(self.search_space, key)
            except KeyError:
                raise ValueError(f"trial.command: ${{{{search_space.{key}}}}} names no "
                                 "parameter of search_space") from None
        if self.trial.array:
            raise ValueError("trial.array: a sweep's trials cannot be job arrays")
        return self

    def redacted(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude_none=True)
        data["trial"] = self.trial.redacted()
        return data


def load_sweep_dict(data: Any, source: str = "sweep", *,
                    base_dir: Path | None = None) -> tuple[SweepSpec, str]:
    """(the sweep, its format: "native" or "aml") from a parsed file."""
    from batchyard.spec.loader import load_job_dict

    if not is_sweep_document(data):
        raise SpecError(f"{source}: not a sweep: give a job file with a `sweep:` block, or an "
                        "Azure ML `type: sweep` job")
    if data.get("type") == "sweep":
        from batchyard.spec.sweep_aml import read_aml_sweep

        return read_aml_sweep(data, source=source, base_dir=base_dir), "aml"
    job = {k: v for k, v in data.items() if k not in ("sweep", "name", "experiment",
                                                      "cluster", "description", "tags")}
    settings = data["sweep"]
    if not isinstance(settings, dict):
        raise SpecError(f"{source}: sweep: expected a mapping (search_space, objective, ...)")
    trial = load_job_dict(job, source, base_dir=base_dir)
    outer = {k: data[k] for k in ("name", "experiment", "cluster", "description", "tags")
             if k in data}
    return validate({**settings, **outer, "trial": trial.model_dump(mode="json",
                                                                   exclude_none=True)},
                    source, prefix="sweep"), "native"


def validate(data: dict[str, Any], source: str, prefix: str = "") -> SweepSpec:
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from(exc, source, prefix=prefix, model=SweepSpec) from None


def load_sweep_file(path: Path) -> tuple[SweepSpec, str]:
    from batchyard.spec.loader import read_document

    path = Path(path)
    return load_sweep_dict(read_document(path), path.name, base_dir=path.absolute().parent)
