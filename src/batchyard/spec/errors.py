"""Turning Pydantic's errors into messages that name the field path the user wrote, and an
unknown field's nearest known one (``node: unknown field; did you mean nodes?``)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from batchyard.errors import SpecError
from batchyard.suggest import nearest


def field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def spec_error_from(exc: ValidationError, source: str, prefix: str = "",
                    model: type[BaseModel] | None = None) -> SpecError:
    """``exc`` as one SpecError naming each field path; with ``model`` (the model that was
    validated), an unknown field also names the nearest field it could have meant."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        path = field_path(loc)
        if prefix:
            path = f"{prefix}.{path}" if path != "(top level)" else prefix
        msg = str(err["msg"]).removeprefix("Value error, ")
        problem: dict[str, Any] = {"field": path}
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
            hit = nearest(str(loc[-1]), fields_at(model, loc[:-1])) if model and loc else None
            if hit:
                msg += f"; did you mean {hit}?"
                problem["suggestion"] = hit
        elif err["type"] == "missing":
            msg = "required field is missing"
        problems.append({**problem, "message": msg})
    lines = "; ".join(p["message"] if p["field"] == "(top level)"
                      else f"{p['field']}: {p['message']}" for p in problems)
    return SpecError(f"{source}: {lines}", details=problems)


def fields_at(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model found at ``loc`` under ``model``, as a file spells them
    (the alias where there is one: Batch AI's camelCase, AML's ``$schema``); none where
    ``loc`` leads to no model."""
    current: Any = model
    for item in loc:
        current = _descend(current, item)
        if current is None:
            return []
    found = _model_in(current)
    if found is None:
        return []
    return [field.alias or name for name, field in found.model_fields.items()]


def _members(annotation: Any) -> list[Any]:
    """The types an annotation may hold (Optional, unions and Annotated unwrapped)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _descend(annotation: Any, item: Any) -> Any:
    """The annotation under ``item`` (a field name or alias, a list index, a mapping key)."""
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel) and isinstance(item, str):
            for name, field in member.model_fields.items():
                if item in (name, field.alias):
                    return field.annotation
        origin = typing.get_origin(member)
        args = typing.get_args(member)
        if origin is list and isinstance(item, int) and args:
            return args[0]
        if origin is dict and isinstance(item, str) and len(args) == 2:
            return args[1]
    return None
