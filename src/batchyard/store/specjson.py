"""A job's spec column, decoded one row at a time and never raising.

SQLite stores JSON as text, and a row written by hand, by an older version or by a bad restore
can hold anything (``this is not json``, NULL, a bare string). Decoded by SQLAlchemy's JSON type
inside a SELECT, one such row failed the whole statement: the scheduler's read of the queue
(no job was scheduled again, a traceback every pass) and ``job list`` (a 500 for everyone).
This type decodes each value itself and turns one it cannot read into an empty
``UnreadableSpec`` that says why, so the row is still a row: the scheduler fails that job alone
naming the cause, and listings show it with ``spec_error``."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import JSON, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine


class UnreadableSpec(dict[str, Any]):
    """A spec that could not be read: empty, with ``error`` saying why."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


def spec_error(spec: Any) -> str | None:
    """Why a job's stored spec cannot be read, or None when it can."""
    if isinstance(spec, UnreadableSpec):
        return spec.error
    if not isinstance(spec, dict):
        return unreadable(spec).error
    return None


def unreadable(value: Any) -> UnreadableSpec:
    if value is None:
        return UnreadableSpec("the job's spec is missing (NULL in the database)")
    return UnreadableSpec(f"the job's spec is a JSON {type(value).__name__}, not an object")


class SpecJSON(TypeDecorator[dict[str, Any]]):
    """JSON, except that SQLite's text is decoded here (per row) rather than by the JSON
    type's result processor, and what is not a JSON object comes back as ``UnreadableSpec``.
    The column's type in the database is unchanged (JSON)."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(Text())
        return dialect.type_descriptor(JSON())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name == "sqlite" and value is not None:
            return json.dumps(value)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> dict[str, Any]:
        if dialect.name == "sqlite" and isinstance(value, str | bytes):
            try:
                value = json.loads(value)
            except ValueError as exc:
                return UnreadableSpec(f"the job's spec is not JSON ({exc})")
        if isinstance(value, dict):
            return value
        return unreadable(value)
