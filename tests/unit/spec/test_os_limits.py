"""Oversized fields are refused at submit, naming the field (issue 33, item 9): a 30 MB
``command`` was accepted and failed at launch with E2BIG. One argument (a ``bash -c`` command
line, an element of an argv list), one environment string, and arguments with the
environment together have limits the kernel enforces at ``execve``; a job over them can never
start, whatever format it came in."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from batchyard.errors import SpecError
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import JobSpec
from batchyard.spec.loader import load_job_dict
from batchyard.spec.oslimits import MAX_ARG_STRLEN, arg_max


def _refusal(spec: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(spec)
    return spec_error_from(info.value, "job spec").message


def test_a_30_mb_command_is_refused_at_once_naming_the_field() -> None:
    started = time.monotonic()
    message = _refusal({"command": "x" * (30 * 1024 * 1024)})
    assert time.monotonic() - started < 5
    assert message.startswith("job spec: command: 30.0 MiB"), message
    assert "128 KiB" in message


@pytest.mark.parametrize(("spec", "field"), [
    ({"command": ["python", "-c", "y" * MAX_ARG_STRLEN]}, "command[2]"),
    ({"command": "true", "prepare": "p" * MAX_ARG_STRLEN}, "prepare"),
    ({"command": "true", "env": {"BIG": "z" * MAX_ARG_STRLEN}}, "env.BIG"),
    ({"command": "true", "secrets": {"KEY": "s" * MAX_ARG_STRLEN}}, "secrets.KEY"),
    ({"command": "true", "env": {f"V{i}": "e" * 100_000 for i in range(arg_max() // 100_000)}},
     "env"),
    ({"command": ["echo", *["a" * 100_000] * (arg_max() // 100_000)]}, "command"),
])
def test_each_oversized_field_is_named(spec: dict[str, object], field: str) -> None:
    message = _refusal(spec)
    assert message.startswith(f"job spec: {field}: "), message
    assert "operating system" in message


def test_what_fits_is_accepted() -> None:
    JobSpec.model_validate({"command": "x" * (MAX_ARG_STRLEN - 1024),
                            "env": {"A": "b" * 100_000}})


def test_a_batch_ai_job_json_is_held_to_the_same_limits() -> None:
    data = {"properties": {"nodeCount": 1, "customToolkitSettings": {
        "commandLine": "c" * (MAX_ARG_STRLEN + 10)}}}
    with pytest.raises(SpecError) as info:
        load_job_dict(data, "job.json")
    assert "command" in info.value.message and "128 KiB" in info.value.message, info.value
