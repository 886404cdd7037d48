"""Signing in to a server (`batchyard login`, the AML compat's
``InteractiveLoginAuthentication``): ask the server how (``GET /api/v1/auth/methods``), get
a token by the flow that fits, have the server confirm who it is (``POST
/api/v1/auth/login``, which the audit trail records) and store it (client.credentials).

A personal token is the built-in flow. A single sign-on flow registers itself in ``FLOWS``
under the kind of method the server announces; it is preferred whenever no token was
given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchyard import errors
from batchyard.client import credentials
from batchyard.client.http import Client

# kind -> flow(server URL, the method as the server described it, ask) -> token; ``ask``
# puts a question to the user and returns the answer (hidden input for secrets).
Flow = Callable[[str, dict[str, Any], Callable[[str], str]], str]
FLOWS: dict[str, Flow] = {}
Ask = Callable[[str], str]


def methods(url: str) -> list[dict[str, Any]]:
    probe = Client(url, None)
    try:
        found = probe.get("/auth/methods").get("methods") or []
    except errors.NotFound:  # a server from before sign-in methods: tokens only
        return [{"kind": "token"}]
    finally:
        probe.close()
    return [m for m in found if isinstance(m, dict)]


def _personal_token(url: str, method: dict[str, Any], ask: Ask) -> str:
    token = ask(f"Personal token for {url} (`batchyard token create` there, or from an "
                "admin)").strip()
    if not token:
        raise errors.UserError("no token given: a personal token is needed to sign in")
    return token


def sign_in(server: str, token: str | None, ask: Ask) -> dict[str, Any]:
    """Sign in to ``server`` with ``token`` (None: by the server's preferred flow that this
    client knows, else a personal token asked for); the stored login's owner, as the server
    answered (``name``, ``admin``, ``roles``...) with ``server``."""
    url = credentials.normal(server)
    offered = methods(url)
    if not token:
        from batchyard.client import sso  # noqa: F401  (registers the single sign-on flow)

        chosen = next(((m, FLOWS[str(m.get("kind"))]) for m in offered
                       if m.get("kind") in FLOWS), ({"kind": "token"}, _personal_token))
        token = chosen[1](url, chosen[0], ask)
    c = Client(url, token)
    try:
        who: dict[str, Any] = c.post("/auth/login")
    finally:
        c.close()
    credentials.store(url, token, who.get("name"))
    return {**who, "server": url}


def client_for(server: str | None = None, token: str | None = None) -> Client:
    """A client of ``server`` (default: BATCHYARD_SERVER, the current login, else the local
    server) with ``token`` (default: as ``Client.connect`` chooses)."""
    import os

    if server is None and token is None:
        return Client.connect()
    url = server or os.environ.get("BATCHYARD_SERVER") or (credentials.current() or ("",))[0]
    if not url:
        local = Client.connect()
        url = local.url
        local.close()
    url = credentials.normal(url)
    return Client(url, token or credentials.token_for(url) or os.environ.get("BATCHYARD_TOKEN"))
