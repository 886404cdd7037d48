"""Turning Pydantic's errors into messages that name the field path the user wrote."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from batchyard.errors import SpecError


def field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def spec_error_from(exc: ValidationError, source: str, prefix: str = "") -> SpecError:
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        path = field_path(loc)
        if prefix:
            path = f"{prefix}.{path}" if path != "(top level)" else prefix
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            msg = "required field is missing"
        problems.append({"field": path, "message": msg})
    lines = "; ".join(p["message"] if p["field"] == "(top level)"
                      else f"{p['field']}: {p['message']}" for p in problems)
    return SpecError(f"{source}: {lines}", details=problems)
