"""Where batchyard keeps its state and how a client finds its server.

Everything hangs off ``$BATCHYARD_HOME`` (default ``~/.batchyard``): the SQLite database, the
API token (mode 0600), the server's address file and log, and the job directories.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path


def home() -> Path:
    path = Path(os.environ.get("BATCHYARD_HOME") or Path.home() / ".batchyard").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_root() -> Path:
    """Root of workspace/cluster directories (DESIGN §5)."""
    return Path(os.environ.get("BATCHYARD_DATA_ROOT") or home())


def database_url() -> str:
    return os.environ.get("BATCHYARD_DB_URL") or f"sqlite:///{home() / 'batchyard.db'}"


def token_path() -> Path:
    return home() / "token"


def server_file() -> Path:
    return home() / "server.json"


def read_token() -> str | None:
    env = os.environ.get("BATCHYARD_TOKEN")
    if env:
        return env.strip()
    try:
        return token_path().read_text().strip() or None
    except FileNotFoundError:
        return None


def ensure_token() -> str:
    """Create the admin token on first start, readable by its owner only."""
    existing = read_token()
    if existing:
        return existing
    token = secrets.token_urlsafe(32)
    path = token_path()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


@dataclass(frozen=True)
class ServerInfo:
    url: str
    pid: int | None


def read_server_info() -> ServerInfo | None:
    env = os.environ.get("BATCHYARD_SERVER")
    if env:
        return ServerInfo(url=env.rstrip("/"), pid=None)
    try:
        data = json.loads(server_file().read_text())
    except (FileNotFoundError, ValueError):
        return None
    return ServerInfo(url=str(data["url"]), pid=data.get("pid"))


def write_server_info(url: str, pid: int) -> None:
    path = server_file()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": pid}))
    os.replace(tmp, path)
