"""Sweep specs in their three shapes, and bad ones refused naming the field."""

from __future__ import annotations

import pytest

from batchyard.errors import SpecError
from batchyard.spec.arrays import parse_array
from batchyard.spec.sweep import load_sweep_dict

NATIVE = {
    "name": "s", "nodes": 2, "command": "python t.py --lr ${{search_space.lr}}",
    "sweep": {"search_space": {"lr": {"type": "loguniform", "min_value": -6,
                                      "max_value": -1}, "bs": [16, 32]},
              "objective": {"primary_metric": "acc", "goal": "MAXIMIZE"},
              "limits": {"max_total_trials": 4, "timeout": "10m"},
              "early_termination": {"type": "BanditPolicy", "slack_factor": 0.1}},
}


def test_native_sweep_block() -> None:
    spec, fmt = load_sweep_dict(NATIVE)
    assert fmt == "native" and spec.name == "s" and spec.trial.nodes == 2
    assert spec.objective.goal == "maximize" and spec.limits.timeout == 600
    assert spec.search_space["bs"].type == "choice"
    assert spec.early_termination is not None and spec.early_termination.type == "bandit"


def test_aml_v2_sweep_job() -> None:
    spec, fmt = load_sweep_dict({
        "type": "sweep", "name": "v2", "compute": "azureml:c1",
        "trial": {"command": "python t.py --lr ${{search_space.lr}} --e ${{inputs.e}}",
                  "resources": {"instance_count": 2}},
        "inputs": {"e": 3}, "sampling_algorithm": "grid",
        "search_space": {"lr": {"type": "choice", "values": [0.1, 0.01]},
                         "k": "choice(1, 2, 3)"},
        "objective": {"primary_metric": "acc", "goal": "minimize"},
        "limits": {"max_concurrent_trials": 2, "trial_timeout": 60},
        "early_termination": {"type": "truncation_selection", "truncation_percentage": 20},
    })
    assert fmt == "aml" and spec.cluster == "c1" and spec.trial.nodes == 2
    assert spec.trial.command == "python t.py --lr ${{search_space.lr}} --e 3"
    assert spec.limits.max_total_trials == 6  # the grid's size
    assert spec.trial.limits.max_wall_clock == 60


@pytest.mark.parametrize(("change", "field"), [
    ({"search_space": {"lr": {"type": "uniform", "min_value": 1}}}, "search_space.lr"),
    ({"search_space": {"lr": {"type": "uniform", "min_value": 2, "max_value": 1}}},
     "search_space.lr"),
    ({"objective": {"primary_metric": "a", "goal": "up"}}, "objective.goal"),
    ({"early_termination": {"type": "bandit"}}, "early_termination"),
    ({"limits": {"max_total_trials": 0}}, "limits.max_total_trials"),
    ({"sampling": {"type": "sobol"}}, "sampling.type"),
])
def test_bad_sweeps_name_the_field(change: dict, field: str) -> None:
    data = {**NATIVE, "sweep": {**NATIVE["sweep"], **change}}
    with pytest.raises(SpecError) as info:
        load_sweep_dict(data)
    assert field in info.value.message, info.value.message


def test_unknown_placeholder_and_not_a_sweep() -> None:
    with pytest.raises(SpecError, match="names no parameter"):
        load_sweep_dict({**NATIVE, "command": "x ${{search_space.nope}}"})
    with pytest.raises(SpecError, match="not a sweep"):
        load_sweep_dict({"command": "x"})


def test_array_syntax() -> None:
    assert parse_array("0-99%8").count == 100 and parse_array("0-99%8").limit == 8
    assert parse_array("1,3,5-7").indices == (1, 3, 5, 6, 7)
    assert parse_array("0-15:4").indices == (0, 4, 8, 12)
    for bad in ("", "5-1", "1-3%0", "a", "0-2:0", "0-20000"):
        with pytest.raises(ValueError):
            parse_array(bad)
