"""Credentials at rest: Fernet (AES-128-CBC + HMAC-SHA256) with one key per installation,
kept in ``$BATCHYARD_HOME/secret.key`` (mode 0600, created on first use). What is sealed is a
JSON object; the database only ever holds the token."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from batchyard.config import home

MASK = "***"


def key_path() -> Path:
    return home() / "secret.key"


def _key() -> bytes:
    from cryptography.fernet import Fernet

    path = key_path()
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    key = Fernet.generate_key()
    tmp = path.with_name(f".secret.key.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    try:
        os.link(tmp, path)  # first writer wins; a racing process reads the winner's key
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_bytes().strip()


def seal(data: dict[str, Any]) -> str:
    """``data`` as an opaque token (empty string for nothing to seal)."""
    if not data:
        return ""
    from cryptography.fernet import Fernet

    return Fernet(_key()).encrypt(json.dumps(data, sort_keys=True).encode()).decode()


def unseal(token: str | None) -> dict[str, Any]:
    if not token:
        return {}
    from cryptography.fernet import Fernet

    value: dict[str, Any] = json.loads(Fernet(_key()).decrypt(token.encode()))
    return value


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every secret value (4+ characters) replaced by the mask."""
    for value in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
