"""What the operating system lets one process be started with, checked at submit.

A 30 MB ``command`` was accepted (after 36 s of submit) and failed at launch with E2BIG: the
kernel refuses ``execve`` of an argument longer than MAX_ARG_STRLEN (128 KiB on Linux: a shell
command line is one argument of ``bash -c``), an environment string longer than that, or
arguments and environment larger together than ARG_MAX. So a job whose command, argument
list, preparation or environment cannot be started is refused when it is submitted, naming the
field and the limit, whatever format it came in."""

from __future__ import annotations

import os
from typing import Any

MAX_ARG_STRLEN = 32 * 4096  # bytes of one argument or environment string, its NUL included
# what batchyard's own environment of a rank takes (its variables, the launcher's
# environment it inherits, the interpreter's shims): kept free of the job's share
RESERVED = 256 * 1024


def arg_max() -> int:
    """ARG_MAX of this machine (the nodes are assumed alike), 2 MiB when unknown."""
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError, AttributeError):
        value = -1
    return int(value) if value and value > 0 else 2 * 1024 * 1024


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape")) + 1


def _human(count: int) -> str:
    if count >= 1024 * 1024:
        return f"{count / 1024 / 1024:.1f} MiB"
    return f"{count // 1024} KiB" if count >= 1024 else f"{count} bytes"


def _argv(field: str, command: str | list[str]) -> tuple[int, list[str]]:
    """(bytes of the argv it starts, problems)."""
    parts = [command] if isinstance(command, str) else list(command)
    problems = []
    for i, part in enumerate(parts):
        size = _size(part)
        if size > MAX_ARG_STRLEN:
            where = field if isinstance(command, str) else f"{field}[{i}]"
            what = ("a shell command line is one argument of bash -c" if isinstance(
                command, str) else "each argument")
            problems.append(
                f"{where}: {_human(size)} is more than the {_human(MAX_ARG_STRLEN)} the "
                f"operating system allows one argument ({what}); put it in a script file "
                "(code:) and run that")
    return sum(_size(p) for p in parts) + 16, problems


def check_launchable(spec: Any) -> None:
    """Raise ValueError naming the first field that cannot be started (``spec``: a JobSpec)."""
    env_bytes = 0
    problems: list[str] = []
    for group in ("env", "secrets"):
        for key, value in (getattr(spec, group) or {}).items():
            size = _size(f"{key}={value}")
            env_bytes += size
            if size > MAX_ARG_STRLEN:
                problems.append(
                    f"{group}.{key}: {_human(size)} is more than the {_human(MAX_ARG_STRLEN)} "
                    "the operating system allows one environment variable; pass it in a file "
                    "(code: or inputs:) instead")
    commands: list[tuple[str, Any]] = [("command", spec.command), ("prepare", spec.prepare)]
    commands += [(f"distribution.role_commands.{role}", cmd)
                 for role, cmd in (spec.distribution.role_commands or {}).items()]
    budget = arg_max() - RESERVED
    if not problems and env_bytes > budget:
        problems.append(f"env: {_human(env_bytes)} of environment variables (env and secrets) "
                        f"is more than the {_human(budget)} the operating system lets a process "
                        "start with (ARG_MAX); pass data in files")
    for field, command in commands:
        if command is None:
            continue
        size, found = _argv(field, command)
        problems += found
        if not found and size + env_bytes > budget:
            problems.append(
                f"{field}: its arguments ({_human(size)}) and the environment (env and "
                f"secrets, {_human(env_bytes)}) are more than the {_human(budget)} the "
                "operating system lets a process start with (ARG_MAX, less what batchyard "
                "sets); make them smaller or pass data in files")
    if problems:
        raise ValueError(problems[0])
