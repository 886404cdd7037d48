"""A job listing is encoded once (routers/jobs.py `plain_json`), into the very bytes FastAPI
made of the same ``list[dict[str, Any]]`` answer: its response model's JSON mode, then
JSONResponse's compact json.dumps."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import TypeAdapter

from batchyard.server.routers.jobs import plain_json

ROWS: list[dict[str, Any]] = [
    {"id": 1, "name": "job-ü✓", "state": "succeeded", "exit_code": 0, "message": 'a "q" \\ \n',
     "submitted_at": datetime(2026, 12, 5, 0, 35, 12, 123456),
     "started_at": datetime(2026, 12, 5, 0, 35, 13),
     "ended_at": datetime(2026, 12, 5, 1, 0, 0, tzinfo=timezone.utc),
     "duration": timedelta(minutes=1, seconds=2, microseconds=5), "array": None,
     "nodes": 2, "big": 2 ** 53 + 1, "flag": True, "tags": {"k": ["v", 1, None]}},
    {"id": 2, "name": "x", "duration": timedelta(0), "pending_reason": "\u0000\u2028"},
]


def test_the_bytes_fastapi_made() -> None:
    for rows in (ROWS, [], ROWS[:1]):
        fastapi = JSONResponse(TypeAdapter(list[dict[str, Any]]).dump_python(rows, mode="json"))
        ours = plain_json(rows, {"X-Next-Cursor": "abc"})
        assert ours.body == fastapi.body
        assert ours.media_type == "application/json"
        assert ours.headers["x-next-cursor"] == "abc"
        assert ours.headers["content-length"] == str(len(fastapi.body))
    assert "x-next-cursor" not in plain_json([]).headers
