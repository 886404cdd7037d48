"""Downloads of what jobs wrote (outputs, logs, setup-task output, datastore files): served
from the portal's own origin, so never as active content. Every download is an attachment
with a non-active type (``text/plain; charset=utf-8`` for text, else
``application/octet-stream``), ``X-Content-Type-Options: nosniff`` (no browser guesses
HTML from the bytes) and a sandboxing CSP (a file opened anyway runs no script and loads
nothing)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import quote

from fastapi.responses import Response, StreamingResponse

from batchyard.server.services.files import Download

CHUNK = 64 * 1024
TEXT = "text/plain; charset=utf-8"
BINARY = "application/octet-stream"
TEXT_SUFFIXES = (".txt", ".log", ".out", ".err", ".csv", ".tsv", ".json", ".jsonl", ".yaml",
                 ".yml", ".md", ".ini", ".cfg", ".toml")


def content_type(filename: str) -> str:
    return TEXT if filename.lower().endswith(TEXT_SUFFIXES) else BINARY


def safe_headers(filename: str) -> dict[str, str]:
    """The headers of every download: attachment, nosniff, sandbox."""
    quoted = quote(filename, safe="")
    disposition = (f'attachment; filename="{filename}"' if quoted == filename
                   else f"attachment; filename*=utf-8''{quoted}")
    return {"Content-Disposition": disposition, "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox; default-src 'none'"}


def bytes_response(content: bytes, filename: str,
                   headers: dict[str, str] | None = None) -> Response:
    return Response(content, media_type=content_type(filename),
                    headers={**safe_headers(filename), **(headers or {})})


def download_response(found: Download, headers: dict[str, str] | None = None) -> Response:
    """Stream an opened job file (``files.open_download``): as many bytes as it had when it
    was opened, from its descriptor (the path is never opened again)."""
    fh = os.fdopen(found.fd, "rb", buffering=0)  # closed when read, or when dropped

    def body() -> Iterator[bytes]:
        with fh:
            left = found.size
            while left > 0:
                data = fh.read(min(CHUNK, left))
                if not data:
                    return
                left -= len(data)
                yield data

    return StreamingResponse(body(), media_type=content_type(found.name),
                             headers={**safe_headers(found.name),
                                      "Content-Length": str(found.size), **(headers or {})})
