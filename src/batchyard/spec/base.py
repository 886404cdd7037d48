"""The base of the spec models: what every field of a job or cluster spec refuses whatever its
type, so that bad input is a 422 naming the field at submit rather than a failure at run
time (or a server error):

* a NUL byte in any text (commands, environment values and names, paths, tags, ...): no
  ``exec``, environment or path can carry one;
* ``true``/``false`` where a number is meant (``nodes: true`` is not one node);
* non-finite numbers (``NaN``, ``Infinity``, ``1e999``) where a float is meant.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def nul_in(value: Any, where: str = "") -> str | None:
    """Where the first NUL byte of a value is (``""`` for the value itself, ``"['A']"`` for
    the value of key ``A``, ``"[1]"`` for the second item), or None if it has none."""
    if isinstance(value, str):
        return where if "\x00" in value else None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = nul_in(item, f"{where}[{index}]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                return f"{where} (the name {key!r})"
            found = nul_in(item, f"{where}[{key!r}]")
            if found is not None:
                return found
    return None


def _leaves(annotation: Any) -> set[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return set().union(*(_leaves(a) for a in typing.get_args(annotation)))
    if origin is typing.Annotated:
        return _leaves(typing.get_args(annotation)[0])
    return {annotation}


def _wants_number(annotation: Any) -> bool:
    leaves = _leaves(annotation)
    return bool(leaves & {int, float}) and not leaves & {bool, Any}


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _wants_number(field.annotation):
                raise ValueError(f"a number, not {str(value).lower()}")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        where = nul_in(value)
        if where is not None:
            raise ValueError(f"{where + ' ' if where else ''}must not contain a NUL byte "
                             "(\\x00)".lstrip())
        return value
