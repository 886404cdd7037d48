"""Reading a job file's document and telling its format, without the spec's models (pydantic):
what `job create -f` needs before it knows which format's models to load (issue 37: a
native job loaded Batch AI's schema too), and all the CLI's quick path needs (cli/quick.py).
`spec.loader` re-exports these."""

from __future__ import annotations

import json
import os

from batchyard.errors import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Literal

    JobFormat = Literal["batchai", "aml", "native"]
else:
    JobFormat = str

# Batch AI's framework blocks (spec/batchai_schema.py's FRAMEWORKS, checked equal by a test)
BATCHAI_FRAMEWORKS = (
    "pyTorchSettings", "chainerSettings", "horovodSettings", "customMpiSettings",
    "tensorFlowSettings", "cntkSettings", "caffeSettings", "caffe2Settings",
    "customToolkitSettings",
)
BATCHAI_KEYS = frozenset({*BATCHAI_FRAMEWORKS, "nodeCount"})


def _syntax_error(source: str, line: int, column: int, kind: str, problem: str) -> SpecError:
    return SpecError(
        f"{source}: line {line}, column {column}: invalid {kind}: {problem}",
        details=[{"line": line, "column": column, "message": problem}],
    )


def read_document(path: Path | str) -> Any:
    """The parsed JSON or YAML in ``path``; syntax errors name the line and column."""
    name = os.path.basename(os.fspath(path))
    try:
        with open(path, encoding="utf-8-sig") as fh:  # Windows editors add a BOM to job.json
            text = fh.read()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{name}: not UTF-8 text ({exc.reason})") from None
    suffix = os.path.splitext(name)[1].lower()
    if suffix == ".json" or (suffix not in (".yaml", ".yml") and text.lstrip().startswith("{")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise _syntax_error(name, exc.lineno, exc.colno, "JSON", exc.msg) from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = str(getattr(exc, "problem", None) or exc)
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        raise _syntax_error(name, line, column, "YAML", problem) from None


def detect_job_format(data: dict[str, Any]) -> JobFormat:
    schema = str(data.get("$schema", "")).lower()
    if "batchai" in schema or "properties" in data or BATCHAI_KEYS & set(data):
        return "batchai"
    if "azureml" in schema or data.get("type") == "command":
        return "aml"
    return "native"


def is_sweep_document(data: Any) -> bool:
    return isinstance(data, dict) and ("sweep" in data or data.get("type") == "sweep")
