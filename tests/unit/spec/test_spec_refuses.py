"""What the job and cluster specs refuse at submit, naming the field, instead of failing at run
time or with a server error: NUL bytes in any text, true/false for a number, non-finite or
out-of-range numbers, lists and mappings as environment values, a 10 MB description, more
parameter servers than ranks (which once made a dry run build a list of 2**64 hosts), and an
address that cannot name a head."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from batchyard.spec.cluster import ClusterSpec
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import JobSpec

BIG = 2**64
JOBS: list[tuple[str, dict[str, Any], str]] = [
    ("nul-command", {"command": "echo \x00"}, "command"),
    ("nul-argv", {"command": ["echo", "a\x00b"]}, "command"),
    ("nul-env", {"env": {"A": "x\x00"}}, "env"),
    ("nul-secret", {"secrets": {"A": "x\x00"}}, "secrets"),
    ("nul-prepare", {"prepare": "pip\x00"}, "prepare"),
    ("nul-python", {"environment": {"python": "py\x00"}}, "environment.python"),
    ("nul-input", {"inputs": {"DATA": "/data\x00"}}, "inputs.DATA.path"),
    ("nul-mpirun", {"distribution": {"type": "mpi", "mpirun_args": ["-x\x00"]}},
     "distribution.mpirun_args"),
    ("nul-tag", {"tags": {"a": "\x00"}}, "tags"),
    ("nodes-true", {"nodes": True}, "nodes"),
    ("ppn-false", {"distribution": {"processes_per_node": False}},
     "distribution.processes_per_node"),
    ("retries-true", {"limits": {"max_retries": True}}, "limits.max_retries"),
    ("env-list", {"env": {"A": [1, 2]}}, "env"),
    ("env-mapping", {"env": {"A": {"b": 1}}}, "env"),
    ("env-null", {"env": {"A": None}}, "env"),
    ("description-10mb", {"description": "x" * 10_000_000}, "description"),
    ("wall-clock-nan", {"limits": {"max_wall_clock": float("nan")}}, "limits.max_wall_clock"),
    ("wall-clock-inf", {"limits": {"max_wall_clock": float("inf")}}, "limits.max_wall_clock"),
    ("wall-clock-huge", {"limits": {"max_wall_clock": 1e300}}, "limits.max_wall_clock"),
    ("wall-clock-huge-int", {"limits": {"max_wall_clock": 10**400}}, "limits.max_wall_clock"),
    ("grace-inf", {"limits": {"grace_period": float("inf")}}, "limits.grace_period"),
    ("exit-code-huge", {"limits": {"retry_exit_codes": [BIG]}}, "limits.retry_exit_codes[0]"),
    ("process-count-huge", {"distribution": {"type": "mpi", "process_count": BIG}},
     "distribution.process_count"),
    ("ps-huge", {"distribution": {"type": "tensorflow", "parameter_server_count": BIG}},
     "distribution.parameter_server_count"),
    ("ps-more-than-ranks", {"distribution": {"type": "tensorflow",
                                             "parameter_server_count": 3}},
     "distribution.parameter_server_count"),
]


@pytest.mark.parametrize(("spec", "field"), [(s, f) for _i, s, f in JOBS],
                         ids=[i for i, _s, _f in JOBS])
def test_job_spec_refuses(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({"command": "true", **spec})
    message = spec_error_from(info.value, "job spec").message
    assert message.startswith(f"job spec: {field}") or f" {field}" in message, message
    assert "Value error" not in message


def test_job_spec_still_takes_what_yaml_users_write() -> None:
    spec = JobSpec.model_validate({"command": "true", "nodes": "2",
                                   "env": {"N": 1, "F": 0.5, "ON": True, "S": "x"},
                                   "limits": {"max_wall_clock": "1h30m"},
                                   "distribution": {"type": "tensorflow",
                                                    "processes_per_node": 2,
                                                    "parameter_server_count": 1}})
    assert spec.nodes == 2 and spec.env == {"N": "1", "F": "0.5", "ON": "True", "S": "x"}
    assert spec.limits.max_wall_clock == 5400.0


CLUSTERS: list[tuple[str, dict[str, Any], str]] = [
    ("ray-address-currency-sign", {"backend": "ray", "address": "\u00a4"}, "address"),
    ("ray-address-port", {"backend": "ray", "address": "head:99999999999999999999"},
     "address"),
    ("ray-address-space", {"backend": "ray", "address": "head 6379"}, "address"),
    ("setup-nul", {"setup_task": {"command": "echo \x00"}}, "setup_task.command"),
    ("setup-env-nul", {"setup_task": {"command": "true", "env": {"A": "\x00"}}},
     "setup_task.env"),
    ("setup-env-list", {"setup_task": {"command": "true", "env": {"A": [1]}}},
     "setup_task.env"),
    ("setup-env-name", {"setup_task": {"command": "true", "env": {"A-B": "1"}}},
     "setup_task.env"),
    ("target-true", {"manual": {"target_node_count": True}}, "manual.target_node_count"),
    ("cpus-huge", {"resources": {"cpus": BIG}}, "resources.cpus"),
    ("gpus-huge", {"resources": {"cpus": 1, "gpus": BIG}}, "resources.gpus"),
    ("memory-inf", {"resources": {"cpus": 1, "memory_gb": float("inf")}},
     "resources.memory_gb"),
    ("initial-huge", {"autoscale": {"max_nodes": 1, "initial_node_count": BIG}},
     "autoscale.initial_node_count"),
    ("idle-inf", {"autoscale": {"max_nodes": 1,
                                "idle_seconds_before_scaledown": float("inf")}},
     "autoscale.idle_seconds_before_scaledown"),
]


@pytest.mark.parametrize(("spec", "field"), [(s, f) for _i, s, f in CLUSTERS],
                         ids=[i for i, _s, _f in CLUSTERS])
def test_cluster_spec_refuses(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        ClusterSpec.model_validate({"name": "c", **spec})
    message = spec_error_from(info.value, "cluster").message
    assert message.startswith(f"cluster: {field}"), message


@pytest.mark.parametrize("address", ["10.0.0.5:6379", "head:6379", "ray://head:10001",
                                     "auto", "[::1]:6379", "head.example.org"])
def test_ray_addresses_that_name_a_head(address: str) -> None:
    assert ClusterSpec.model_validate({"name": "r", "backend": "ray",
                                       "address": address}).address == address
