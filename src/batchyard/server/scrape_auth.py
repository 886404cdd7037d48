"""Who may scrape ``GET /metrics``: Prometheus with the scrape token (``batchyard server token
--scrape``: batchyard/scrape_token.py), the admin token, or, with no token
at all, a client on loopback of a server that listens on loopback only. A scrape token reaches
nothing but /metrics; a wrong token is a 401 even on loopback."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

from fastapi import Request
from starlette.requests import HTTPConnection

from batchyard.errors import AuthError
from batchyard.scrape_token import read, token_file
from batchyard.server.auth import server_context
from batchyard.server.security.permissions import Rule

_cached: tuple[float, str | None] = (-1.0, None)


def _current() -> str | None:
    """The token file's content, read again only when the file changes."""
    global _cached
    try:
        stamp = token_file().stat().st_mtime
    except FileNotFoundError:
        return None
    if stamp != _cached[0]:
        _cached = (stamp, read())
    return _cached[1]


def _loopback(host: str | None) -> bool:
    from batchyard.server.main import is_loopback

    return bool(host) and is_loopback(str(host))


def _peer_is_loopback(request: Request) -> bool:
    client = request.client
    if client is None:  # a Unix socket (a worker's private one): this machine
        return True
    try:
        return ipaddress.ip_address(client.host).is_loopback
    except ValueError:
        return False


async def require_scrape(request: Request) -> None:
    """The dependency of /metrics."""
    ctx = server_context(request)
    header = request.headers.get("authorization")
    if not header:
        if _loopback(ctx.bind_host) and _peer_is_loopback(request):
            return
        raise AuthError("missing bearer token: /metrics needs the scrape token (`batchyard "
                        "server token --scrape`) on a server that listens beyond loopback")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthError("send the scrape token as 'Authorization: Bearer <token>'")
    scrape = _current()
    for good in (scrape, ctx.admin_token):
        if good and hmac.compare_digest(token.encode(), good.encode()):
            return
    raise AuthError("invalid scrape token")


class Scrape(Rule):
    """The route rule of /metrics (security.permissions): the checks above, nothing more."""

    label = "scrape"

    async def check(self, conn: HTTPConnection) -> Any:
        assert isinstance(conn, Request)
        await require_scrape(conn)
        return None
