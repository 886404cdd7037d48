"""Following a job's logs across a server that goes away for a moment.

`job logs -f` quit (exit 4, "incomplete chunked read") when the worker process its stream came
from was killed and started again by its supervisor, and the lines written meanwhile were
never shown to it; a 503 while the database restarted did the same. A follower here reads the
resumable stream (``format=jsonl``, server/services/log_frames.py): on a broken stream, a
refused connection or a 502/503/504 it reconnects with backoff (following the home's address
if the server moved) and sends back the cursor of the last piece it handed on, so every line
comes exactly once. A stream that ends with its end line is the end; one that just stops was
cut. It gives up after ``PATIENCE`` seconds without reaching the server."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from batchyard import errors
from batchyard.client.http import Client, checked_path
from batchyard.client.wire import TransportFailed

PATIENCE = 300.0  # s of failed reconnects before giving up (a server that stays away)
RETRY_STATUS = (502, 503, 504)
FIRST_DELAY = 0.2
MAX_DELAY = 5.0


class _Retry(Exception):
    """The stream broke, or the server cannot answer now: reconnect."""


def follow_logs(client: Client, path: str, *, on_retry: Callable[[str], None] | None = None,
                patience: float = PATIENCE, **params: Any) -> Iterator[bytes]:
    """The job's log text (``path``: the job's API path), as the server sends it, until the
    job has ended and every line is out. ``params``: node, rank, stream, attempt, prefix.
    ``on_retry`` is told why each reconnect happens (a CLI says it once on stderr)."""
    query = {k: v for k, v in params.items() if v is not None}
    cursor = ""
    delay = FIRST_DELAY
    failing_since: float | None = None
    while True:
        try:
            for piece in _frames(client, path + "/logs", {**query, "follow": True,
                                                           "format": "jsonl",
                                                           "cursor": cursor}):
                failing_since, delay = None, FIRST_DELAY
                if piece.get("text"):
                    yield str(piece["text"]).encode("utf-8", "surrogateescape")
                cursor = str(piece.get("cursor") or cursor)  # once handed on: never again
                if piece.get("end"):
                    return
            raise _Retry("the log stream ended early")
        except _Retry as why:
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > patience:
                raise errors.ServerUnavailable(
                    f"lost the log stream from {client.url} and could not get it back for "
                    f"{patience:.0f} s: {why}") from None
            if on_retry is not None:
                on_retry(str(why))
            time.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)
            client.follow_home()


def _frames(client: Client, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    try:
        with client._http.stream("GET", checked_path(path), params=params,
                                 timeout=(30.0, None)) as resp:  # (connect, read)
            if resp.status_code in RETRY_STATUS:
                resp.read()
                raise _Retry(f"the server answered {resp.status_code}")
            if resp.status_code >= 400:
                resp.read()
                client._result(resp)  # raises the error it names (404, 401, ...)
            for line in resp.iter_lines():
                if not line:
                    continue
                try:
                    piece = json.loads(line)
                except ValueError:  # a line cut by a broken connection
                    raise _Retry("the log stream broke mid-line") from None
                if isinstance(piece, dict):
                    yield piece
    except TransportFailed as exc:  # refused, reset, an incomplete chunked read
        raise _Retry(f"{type(exc).__name__}: {exc}") from None
