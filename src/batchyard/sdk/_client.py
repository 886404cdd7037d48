"""The HTTP client the SDK objects share: the CLI's client, found the same way (a configured
server, else the local one, started on demand). Inside a job, the job's own API address and
job-scoped token are used instead, and no server is ever started from a rank."""

from __future__ import annotations

import os
import threading

from batchyard.client.http import Client

_lock = threading.Lock()
_client: Client | None = None
_key: tuple[str | None, ...] | None = None


def _env_key() -> tuple[str | None, ...]:
    return tuple(os.environ.get(k) for k in ("BATCHYARD_HOME", "BATCHYARD_SERVER",
                                              "BATCHYARD_API", "BATCHYARD_TOKEN"))


def in_job_client() -> Client | None:
    """A client on the job token when this process is a rank of a batchyard job."""
    api, token = os.environ.get("BATCHYARD_API"), os.environ.get("BATCHYARD_TOKEN")
    if api and token and token.startswith("job."):
        return Client(api, token)
    return None


def default_client() -> Client:
    """One client per process and configuration (re-made when BATCHYARD_HOME or the server
    settings change, e.g. between test modules)."""
    global _client, _key
    key = _env_key()
    with _lock:
        if _client is None or key != _key:
            _client = in_job_client() or Client.connect()
            _key = key
        return _client


def set_default_client(client: Client | None) -> None:
    """Use ``client`` for SDK objects made without one (None: find the server again)."""
    global _client, _key
    with _lock:
        _client = client
        _key = _env_key() if client is not None else None
