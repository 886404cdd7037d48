"""`job create` overrides: `--set path=value` (as `az ml job create --set`), `--env K=V`,
`--tag k=v`, `--nodes`, `--processes-per-node` and `--priority`, applied to the native spec a
job file was loaded into, before it is sent, so one file serves several runs.

A path is dotted, with list items as ``[i]`` or ``.i`` (``distribution.processes_per_node``,
``env.SEED``, ``mounts[0].source``); a value is read as a YAML scalar (``2`` is a number,
``true`` a boolean, ``[a, b]`` a list), and as the text itself where the field wants text; an
empty value (``--set limits.max_wall_clock=``) removes the setting (its default applies).
Every override is checked against the job schema at once: a bad path or value is a
``UserError`` naming it (the CLI exits 2)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from batchyard.errors import UserError

_TOKEN = re.compile(r"\[(\d+)\]|([^.\[\]]+)")
_STR_MAPS = ("env", "secrets", "tags")  # dict[str, str] fields: values stay text


def parse_path(path: str) -> list[str | int]:
    """``mounts[0].source`` -> ``["mounts", 0, "source"]``; digits alone are list indexes."""
    text = path.strip()
    parts: list[str | int] = []
    pos = 0
    while pos < len(text):
        if text[pos] == "." and parts:
            pos += 1
        match = _TOKEN.match(text, pos)
        if match is None:
            raise UserError(f"--set {path}: not a dotted path (e.g. distribution.processes_"
                            "per_node or mounts[0].source)")
        index, key = match.groups()
        parts.append(int(index) if index is not None else
                     int(key) if key.isdigit() else key)
        pos = match.end()
    if not parts or not isinstance(parts[0], str):
        raise UserError(f"--set {path!r}: give a field path (e.g. nodes=2)")
    return parts


def scalar(raw: str) -> Any:
    """A value as YAML reads it; text that is not valid YAML stays text."""
    if raw == "":
        return None
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _describe(parts: list[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set (None: remove) one value at ``path`` in ``doc``, making mappings on the way."""
    parts = parse_path(path)
    node: Any = doc
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        here = _describe(parts[: i + 1])
        if isinstance(node, dict):
            if isinstance(part, int):
                raise UserError(f"--set {path}: {_describe(parts[:i]) or 'the job'} is a "
                                f"mapping, not a list (no item [{part}])")
            if last:
                if value is None:
                    node.pop(part, None)
                else:
                    node[part] = value
                return
            if not isinstance(node.get(part), dict | list):
                if node.get(part) is not None:
                    raise UserError(f"--set {path}: {here} is a "
                                    f"{type(node[part]).__name__}, not a mapping")
                node[part] = {}
            node = node[part]
        elif isinstance(node, list):
            if not isinstance(part, int):
                raise UserError(f"--set {path}: {_describe(parts[:i])} is a list: give an "
                                f"item number, e.g. {_describe(parts[:i])}[0]")
            if part >= len(node):
                raise UserError(f"--set {path}: {_describe(parts[:i])} has {len(node)} "
                                f"item(s) (numbered from 0)")
            if last:
                if value is None:
                    node.pop(part)
                else:
                    node[part] = value
                return
            node = node[part]
        else:  # pragma: no cover - a scalar is caught one level up
            raise UserError(f"--set {path}: {_describe(parts[:i])} is not a mapping")


def key_value(item: str, option: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise UserError(f"{option} {item!r}: give KEY=VALUE (e.g. {option} SEED=1)")
    return key.strip(), value


def _problem(doc: dict[str, Any], what: str) -> UserError | None:
    """What the job schema says is wrong with ``doc`` (None: nothing)."""
    from pydantic import ValidationError

    from batchyard.spec.errors import spec_error_from
    from batchyard.spec.job import JobSpec

    try:
        JobSpec.model_validate(doc)
    except ValidationError as exc:
        return UserError(spec_error_from(exc, what, model=JobSpec).message)
    return None


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    import copy

    trial = copy.deepcopy(doc)
    set_path(trial, path, value)
    return trial


def apply(doc: dict[str, Any], *, sets: Sequence[str] = (), env: Sequence[str] = (),
          tags: Sequence[str] = (), nodes: int | None = None,
          processes_per_node: int | None = None, priority: str | None = None
          ) -> dict[str, Any]:
    """``doc`` (a native spec as JSON data) with the overrides applied, in this order: every
    ``--set``, then ``--env``, ``--tag``, ``--nodes``, ``--processes-per-node``,
    ``--priority`` (the named options win over a ``--set`` of the same field)."""
    import copy

    doc = copy.deepcopy(doc)
    for item in sets:
        path, sep, raw = item.partition("=")
        path = path.strip()
        if not sep or not path:
            raise UserError(f"--set {item!r}: give PATH=VALUE (e.g. --set "
                            "distribution.processes_per_node=2)")
        parts = parse_path(path)
        text_field = parts[0] in _STR_MAPS and len(parts) == 2 and raw != ""
        value = raw if text_field else scalar(raw)
        what = f"--set {path}={raw}"
        trial = _with(doc, path, value)
        problem = _problem(trial, what)
        if problem is not None and value is not None and not isinstance(value, str):
            as_text = _with(doc, path, raw)  # a field that wants text: `--set command=true`
            if _problem(as_text, what) is None:
                trial, problem = as_text, None
        if problem is not None:
            raise problem
        doc = trial
    for option, field, items in (("--env", "env", env), ("--tag", "tags", tags)):
        for item in items:
            key, value = key_value(item, option)
            doc.setdefault(field, {})[key] = value
    if nodes is not None:
        doc["nodes"] = nodes
    if processes_per_node is not None:
        doc.setdefault("distribution", {})["processes_per_node"] = processes_per_node
    if priority is not None:
        doc["priority"] = priority
    if env or tags or nodes is not None or processes_per_node is not None or priority:
        problem = _problem(doc, "--env/--tag/--nodes/--processes-per-node/--priority")
        if problem is not None:
            raise problem
    return doc
