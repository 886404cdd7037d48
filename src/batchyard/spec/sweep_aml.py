"""Azure ML v2 sweep-job YAML (``type: sweep``, ``az ml job create -f sweep.yml``) as the
native SweepSpec.

The trial is read as an AML v2 command job (``spec.amlv2``) made of the ``trial:`` block and
the sweep's own ``inputs``, ``outputs``, ``compute``, ``resources``, ``distribution`` and
``environment_variables`` (a value in ``trial:`` wins). ``${{search_space.x}}`` is kept for
the sweep driver to fill per trial: it is masked while the command job is read (which knows
only inputs and outputs) and put back after.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from batchyard.errors import SpecError
from batchyard.spec.sweep import SweepSpec, validate
from batchyard.suggest import did_you_mean
from batchyard.sweeps.substitute import PLACEHOLDER

_TOP = {"$schema", "type", "name", "display_name", "experiment_name", "description", "tags",
        "properties", "compute", "inputs", "outputs", "trial", "sampling_algorithm",
        "search_space", "objective", "limits", "early_termination", "resources",
        "distribution", "environment_variables", "identity", "queue_settings"}
_TRIAL_KEYS = ("command", "code", "environment", "environment_variables", "distribution",
               "resources")
_MASK = "BATCHYARD_SWEEP_PARAM_{}_END"
_UNMASK = re.compile(r"BATCHYARD_SWEEP_PARAM_([A-Za-z0-9_.-]+?)_END")


def _fail(source: str, path: str, message: str) -> SpecError:
    return SpecError(f"{source}: {path}: {message}", details=[{"field": path,
                                                               "message": message}])


def _space(raw: Any, source: str) -> dict[str, Any]:
    """AML v2 writes ``{type: choice, values: [...]}``; also accepted: the v1-style call
    ``choice(1, 2)`` as a string, as the v2 SDK prints it."""
    if not isinstance(raw, dict) or not raw:
        raise _fail(source, "search_space", "give at least one parameter")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, str):
            match = re.match(r"^\s*(\w+)\s*\((.*)\)\s*$", value)
            if not match:
                raise _fail(source, f"search_space.{key}", "expected {type: ..., ...} or "
                            "choice(...)")
            import ast

            try:
                args = list(ast.literal_eval(f"[{match.group(2)}]"))
            except (ValueError, SyntaxError):
                raise _fail(source, f"search_space.{key}", f"cannot read {value!r}") from None
            value = _from_call(match.group(1).lower(), args, f"search_space.{key}", source)
        out[key] = value
    return out


_CALL_FIELDS = {"uniform": ("min_value", "max_value"), "loguniform": ("min_value", "max_value"),
                "quniform": ("min_value", "max_value", "q"),
                "qloguniform": ("min_value", "max_value", "q"), "normal": ("mu", "sigma"),
                "lognormal": ("mu", "sigma"), "qnormal": ("mu", "sigma", "q"),
                "qlognormal": ("mu", "sigma", "q"), "randint": ("upper",)}


def _from_call(kind: str, args: list[Any], where: str, source: str) -> dict[str, Any]:
    if kind == "choice":
        values = args[0] if len(args) == 1 and isinstance(args[0], list | tuple) else args
        return {"type": "choice", "values": list(values)}
    fields = _CALL_FIELDS.get(kind)
    if fields is None or len(args) != len(fields):
        raise _fail(source, where, f"{kind}(...) is not a distribution this reads")
    return {"type": kind, **dict(zip(fields, args, strict=True))}


def _mask(text: str) -> str:
    return PLACEHOLDER.sub(lambda m: _MASK.format(m.group(1)), text)


def _unmask(value: Any) -> Any:
    if isinstance(value, str):
        return _UNMASK.sub(lambda m: "${{search_space." + m.group(1) + "}}", value)
    if isinstance(value, list):
        return [_unmask(v) for v in value]
    if isinstance(value, dict):
        return {k: _unmask(v) for k, v in value.items()}
    return value


def read_aml_sweep(data: dict[str, Any], *, source: str = "sweep.yml",
                   base_dir: Path | None = None) -> SweepSpec:
    from batchyard.spec.loader import load_job_dict

    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise _fail(source, unknown[0], "unknown field of a sweep job"
                    + did_you_mean(unknown[0], _TOP))
    trial_raw = data.get("trial")
    if not isinstance(trial_raw, dict) or not trial_raw.get("command"):
        raise _fail(source, "trial.command", "a sweep needs a trial with a command")
    extra = sorted(set(trial_raw) - set(_TRIAL_KEYS))
    if extra:
        raise _fail(source, f"trial.{extra[0]}", "unknown field of a sweep's trial"
                    + did_you_mean(extra[0], _TRIAL_KEYS))
    command_job: dict[str, Any] = {"type": "command"}
    for key in ("inputs", "outputs", "compute", "resources", "distribution",
                "environment_variables", "experiment_name"):
        if key in data:
            command_job[key] = data[key]
    command_job.update(trial_raw)
    command_job["command"] = _mask(str(trial_raw["command"]))
    env = command_job.get("environment_variables")
    if isinstance(env, dict):
        command_job["environment_variables"] = {k: _mask(v) if isinstance(v, str) else v
                                                for k, v in env.items()}
    limits = data.get("limits") or {}
    if not isinstance(limits, dict):
        raise _fail(source, "limits", "expected a mapping")
    if limits.get("trial_timeout") is not None:
        command_job["limits"] = {"timeout": limits["trial_timeout"]}
    trial = load_job_dict(command_job, source, base_dir=base_dir)
    trial_data = _unmask(trial.model_dump(mode="json", exclude_none=True))
    objective = data.get("objective")
    if not isinstance(objective, dict):
        raise _fail(source, "objective", "give primary_metric and goal")
    sampling = data.get("sampling_algorithm", "random")
    sweep: dict[str, Any] = {
        "name": data.get("name") or data.get("display_name"),
        "experiment": data.get("experiment_name"), "description": data.get("description"),
        "tags": {k: "" if v is None else str(v) for k, v in (data.get("tags") or {}).items()},
        "cluster": trial.cluster, "trial": {**trial_data, "cluster": None},
        "search_space": _space(data.get("search_space"), source),
        "sampling": sampling, "objective": objective,
        "limits": {k: v for k, v in limits.items() if k != "trial_timeout"},
        "early_termination": data.get("early_termination"),
    }
    return validate({k: v for k, v in sweep.items() if v is not None}, source)
