"""Putting a trial's hyperparameters into its job, the two ways Azure ML did:

* AML v2: ``${{search_space.lr}}`` anywhere in the command (and TensorFlow role commands,
  and environment values) becomes the value;
* AML v1 ``HyperDriveConfig``: a parameter named like an option (``"--lr"``) is appended to
  the command as ``--lr VALUE``, as HyperDrive passed them to the entry script.

A shell command line gets shell-quoted values; an argv list gets each value as one word.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

PLACEHOLDER = re.compile(r"\$\{\{\s*search_space\.([A-Za-z0-9_.-]+)\s*\}\}")


def text_of(value: Any) -> str:
    """A value as a command-line word: 0.001 stays 0.001, True is True (as Python prints
    it, which is what argparse-based AML scripts parsed), a float keeps its shortest form."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return repr(value)  # 32.0: a q-distribution's value stays a float, as in AML
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def lookup(params: Mapping[str, Any], key: str) -> Any:
    """``lr`` finds the parameter ``lr`` or ``--lr`` (an AML v1 name used in a v2 way)."""
    for name in (key, f"--{key}", f"-{key}"):
        if name in params:
            return params[name]
    raise KeyError(key)


def placeholders(texts: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for text in texts:
        found.update(PLACEHOLDER.findall(text))
    return found


def _fill(text: str, params: Mapping[str, Any], quote: bool) -> str:
    def replace(match: re.Match[str]) -> str:
        value = text_of(lookup(params, match.group(1)))
        return shlex.quote(value) if quote else value

    return PLACEHOLDER.sub(replace, text)


def _command(command: str | list[str], params: Mapping[str, Any]) -> str | list[str]:
    options = [(k, v) for k, v in params.items() if k.startswith("-")]
    if isinstance(command, list):
        out = [_fill(word, params, quote=False) for word in command]
        for key, value in options:
            out += [key, text_of(value)]
        return out
    line = _fill(command, params, quote=True)
    if options:
        line += " " + shlex.join([w for k, v in options for w in (k, text_of(v))])
    return line


def apply(trial: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The trial template (a JobSpec as JSON data) with ``params`` substituted."""
    out = dict(trial)
    if out.get("command") is not None:
        out["command"] = _command(out["command"], params)
    dist = dict(out.get("distribution") or {})
    if dist.get("role_commands"):
        dist["role_commands"] = {role: _command(cmd, params) if not isinstance(cmd, str)
                                 else _fill(cmd, params, quote=True)
                                 for role, cmd in dist["role_commands"].items()}
        out["distribution"] = dist
    if out.get("env"):
        out["env"] = {k: _fill(v, params, quote=False) for k, v in out["env"].items()}
    return out


def texts(trial: Mapping[str, Any]) -> list[str]:
    """Every text of a trial template that may hold placeholders."""
    found: list[str] = []
    command = trial.get("command")
    found += command if isinstance(command, list) else [command] if command else []
    for cmd in ((trial.get("distribution") or {}).get("role_commands") or {}).values():
        found += cmd if isinstance(cmd, list) else [cmd]
    found += list((trial.get("env") or {}).values())
    return [str(t) for t in found]
