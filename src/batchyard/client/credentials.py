"""Stored logins (`batchyard login`): a credential per server in ``~/.batchyard/credentials``
(``$BATCHYARD_HOME/credentials``), readable by its owner only, and which server the last
login chose. The CLI and SDK use it when BATCHYARD_TOKEN does not say otherwise.

    {"current": "https://10.0.0.5:8742",
     "servers": {"https://10.0.0.5:8742": {"token": "pat.…", "user": "alice", "at": 1.7e9}}}
"""

from __future__ import annotations

import json
import os
import time

from batchyard.config import PRIVATE_FILE, home, home_dir

TYPE_CHECKING = False  # (pathlib, typing, urllib: loaded where used; the CLI's start-up)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


def path() -> Path:
    return home() / "credentials"


def normal(url: str) -> str:
    """One spelling per server: scheme and host in lower case, no trailing slash."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        from batchyard.errors import SpecError

        raise SpecError(f"--server {url!r}: a server URL, e.g. https://10.0.0.5:8742")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"),
                       "", ""))


def load() -> dict[str, Any]:
    try:
        with open(os.path.join(home_dir(), "credentials")) as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return {"current": None, "servers": {}}
    if not isinstance(data, dict) or not isinstance(data.get("servers"), dict):
        return {"current": None, "servers": {}}
    return data


def _save(data: dict[str, Any]) -> None:
    target = path()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                 PRIVATE_FILE)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
    os.chmod(tmp, PRIVATE_FILE)
    os.replace(tmp, target)


def store(url: str, token: str, user: str | None) -> None:
    """Keep ``token`` for ``url`` and make it the server later commands talk to."""
    data = load()
    key = normal(url)
    data["servers"][key] = {"token": token, "user": user, "at": time.time()}
    data["current"] = key
    _save(data)


def forget(url: str | None = None) -> str | None:
    """Drop the login of ``url`` (None: the current one); the server it was, if any."""
    data = load()
    key = normal(url) if url else data.get("current")
    if not key or key not in data["servers"]:
        return None
    del data["servers"][key]
    if data.get("current") == key:
        data["current"] = None
    _save(data)
    return str(key)


def token_for(url: str) -> str | None:
    try:
        found = load()["servers"].get(normal(url))
    except Exception:  # a URL that is no URL: no stored login for it
        return None
    token = found.get("token") if isinstance(found, dict) else None
    return str(token) if token else None


def current() -> tuple[str, str] | None:
    """(server URL, token) of the last login, when it is still stored."""
    data = load()
    key = data.get("current")
    token = token_for(key) if isinstance(key, str) else None
    return (str(key), token) if token else None
