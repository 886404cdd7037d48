"""The resumable form of a log stream (``format=jsonl``): each piece of the stream is one JSON
line, ``{"text": ..., "cursor": ...}``, and the stream ends with ``{"end": true, ...}``.

Why: a follower whose connection broke (a worker of the server restarted, a 503 while the
database came back) could only start again from the beginning or give up; it gave up, and the
lines written meanwhile were never shown to it. The cursor says how far each log file was sent
(in complete lines), so a follower that sends it back (``cursor=``) gets exactly the lines after
the last one it printed, each once. A stream that ends without its end line was cut: the
follower reconnects. The text is the plain stream's, the bytes kept as they are (JSON's
``\\udcXX`` escapes for bytes that are not UTF-8, ``surrogateescape``)."""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from pathlib import Path

from batchyard.errors import SpecError

MAX_CURSOR = 64 * 1024  # characters: a cursor of a few thousand log files


def source_key(path: Path) -> str:
    """A log file's name in a cursor: its attempt (the uuid dir) and its file name."""
    return f"{path.parent.parent.name}/{path.name}"


def encode_cursor(offsets: dict[str, int]) -> str:
    raw = json.dumps(offsets, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 6)).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[str, int]:
    """Offsets by ``source_key``; '' is the start. Anything not made by ``encode_cursor`` is
    a 422 naming the parameter."""
    if not cursor:
        return {}
    try:
        if len(cursor) > MAX_CURSOR:
            raise ValueError("too long")
        raw = zlib.decompress(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)),
                              bufsize=1 << 16)
        data = json.loads(raw)
        if isinstance(data, dict) and all(isinstance(k, str) and isinstance(v, int)
                                          and v >= 0 for k, v in data.items()):
            return data
    except (binascii.Error, zlib.error, ValueError, UnicodeDecodeError):
        pass
    raise SpecError("cursor: not a cursor of this job's log stream (send back the last "
                    "'cursor' a format=jsonl stream gave, as it came)")


def frame(text: bytes, cursor: str) -> bytes:
    return json.dumps({"text": text.decode("utf-8", "surrogateescape"),
                       "cursor": cursor}).encode() + b"\n"


def end_frame(state: str, cursor: str) -> bytes:
    """The last line of a stream that ended on purpose (the job ended and was drained, or
    it was not followed)."""
    return json.dumps({"end": True, "state": state, "cursor": cursor}).encode() + b"\n"
