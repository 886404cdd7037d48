"""Reading a job or cluster file in any accepted format (DESIGN §3) into the one native spec.

The format is told from the content, not the file name, so a Batch AI ``job.json`` renamed to
``.yaml`` (or an AML job saved as JSON) still reads correctly. Relative local paths are made
absolute against the job file's directory, because the server, not the user's shell, is what
later resolves them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from batchyard.errors import SpecError
from batchyard.spec.amlv2 import read_aml_job
from batchyard.spec.batchai import FRAMEWORKS, read_batchai_cluster, read_batchai_job
from batchyard.spec.cluster import ClusterSpec
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import JobSpec

JobFormat = Literal["batchai", "aml", "native"]
_BATCHAI_KEYS = frozenset({*FRAMEWORKS, "nodeCount"})
_BATCHAI_CLUSTER_KEYS = frozenset({"vmSize", "scaleSettings", "vmPriority", "nodeSetup"})


def _syntax_error(source: str, line: int, column: int, kind: str, problem: str) -> SpecError:
    return SpecError(
        f"{source}: line {line}, column {column}: invalid {kind}: {problem}",
        details=[{"line": line, "column": column, "message": problem}],
    )


def read_document(path: Path) -> Any:
    """The parsed JSON or YAML in ``path``; syntax errors name the line and column."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # Windows editors add a BOM to job.json
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path.name}: not UTF-8 text ({exc.reason})") from None
    suffix = path.suffix.lower()
    if suffix == ".json" or (suffix not in (".yaml", ".yml") and text.lstrip().startswith("{")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise _syntax_error(path.name, exc.lineno, exc.colno, "JSON", exc.msg) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = str(getattr(exc, "problem", None) or exc)
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        raise _syntax_error(path.name, line, column, "YAML", problem) from None


def detect_job_format(data: dict[str, Any]) -> JobFormat:
    schema = str(data.get("$schema", "")).lower()
    if "batchai" in schema or "properties" in data or _BATCHAI_KEYS & set(data):
        return "batchai"
    if "azureml" in schema or data.get("type") == "command":
        return "aml"
    return "native"


def _is_relative_local(path: str | None) -> bool:
    return bool(path) and not (
        os.path.isabs(str(path))
        or str(path).startswith(("$", "~", "azureml:"))
        or "://" in str(path)
    )


def _absolute(spec: JobSpec, base: Path) -> JobSpec:
    def fix(path: str) -> str:
        return os.path.normpath(base / path)

    update: dict[str, Any] = {}
    if spec.code and _is_relative_local(spec.code):
        update["code"] = fix(spec.code)
    update["inputs"] = {
        key: item.model_copy(update={"path": fix(item.path)})
        if _is_relative_local(item.path) else item
        for key, item in spec.inputs.items()
    }
    update["mounts"] = [
        m.model_copy(update={"source": fix(m.source)})
        if m.kind == "local" and _is_relative_local(m.source) else m
        for m in spec.mounts
    ]
    return spec.model_copy(update=update)


def load_job_dict(
    data: Any, source: str = "job", ignore: AbstractSet[str] = frozenset(),
    *, base_dir: Path | None = None,
) -> JobSpec:
    """A job given as parsed data (the API's request body, or a file's content)."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of job fields at the top level")
    fmt = detect_job_format(data)
    if fmt == "batchai":
        spec = read_batchai_job(data, ignore=ignore, source=source)
    elif fmt == "aml":
        spec = read_aml_job(data, source=source)
    else:
        try:
            spec = JobSpec.model_validate(data)
        except ValidationError as exc:
            raise spec_error_from(exc, source=source, model=JobSpec) from None
    return _absolute(spec, base_dir) if base_dir is not None else spec


def load_job_file(path: Path, *, ignore: AbstractSet[str] = frozenset()) -> JobSpec:
    """A job file in any accepted format; relative local paths resolve against its folder."""
    path = Path(path)
    return load_job_dict(
        read_document(path), path.name, ignore, base_dir=path.absolute().parent
    )


def load_cluster_dict(
    data: Any, source: str = "cluster", name: str | None = None,
    ignore: AbstractSet[str] = frozenset(),
) -> ClusterSpec:
    """A cluster as parsed data; ``name`` (the CLI's ``-n``) wins over a name in the data."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of cluster fields at the top level")
    is_batchai = "properties" in data or bool(_BATCHAI_CLUSTER_KEYS & set(data))
    chosen = name or (None if is_batchai else data.get("name"))
    if not chosen:
        raise SpecError(f"{source}: name: give the cluster a name")
    if is_batchai:
        return read_batchai_cluster(data, str(chosen), ignore=ignore, source=source)
    try:
        return ClusterSpec.model_validate({**data, "name": chosen})
    except ValidationError as exc:
        raise spec_error_from(exc, source=source, model=ClusterSpec) from None


def load_cluster_file(
    path: Path, name: str | None = None, *, ignore: AbstractSet[str] = frozenset()
) -> ClusterSpec:
    """A Batch AI cluster.json or native cluster YAML; unnamed, it is named after the file."""
    path = Path(path)
    data = read_document(path)
    if name is None and isinstance(data, dict) and not data.get("name"):
        name = path.stem
    return load_cluster_dict(data, path.name, name, ignore)
