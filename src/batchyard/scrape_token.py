"""The scrape token: what Prometheus sends to the server's ``GET /metrics`` and nothing else
accepts. ``$BATCHYARD_HOME/scrape-token`` (mode 0600), made on first use by whichever comes
first, ``batchyard server token --scrape`` or the server. Standard library only (the CLI)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from batchyard.config import home

PREFIX = "scrape."


def token_file() -> Path:
    return home() / "scrape-token"


def read() -> str | None:
    try:
        return token_file().read_text().strip() or None
    except FileNotFoundError:
        return None


def ensure() -> str:
    existing = read()
    if existing:
        return existing
    token = PREFIX + secrets.token_urlsafe(32)
    try:
        fd = os.open(token_file(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # made meanwhile by another process
        return read() or token
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token
