"""The server's context as a dependency, and the principal type. Who may call a route is
declared at the route (``server.security.permissions``); credentials are checked in
``server.security.authn``."""

from __future__ import annotations

from fastapi import Request

from batchyard.server.context import ServerContext
from batchyard.server.security.principal import Principal

__all__ = ["Principal", "context", "server_context"]


def server_context(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    return ctx


async def context(request: Request) -> ServerContext:
    """The dependency. Async: what needs no database runs on the event loop (a sync
    dependency costs a trip to a worker thread on every request)."""
    return server_context(request)
