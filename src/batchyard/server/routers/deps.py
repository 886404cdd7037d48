"""Shared router dependencies: one database session (one transaction) per request.

The transaction commits when the route function returns, before the response is sent
(``scope="function"``): a client that reads right after a write must see it, and a commit
that fails must fail the request. (With FastAPI's default request scope the commit ran after
the response had gone out, so a create-then-get could answer 404.)
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import Depends
from sqlalchemy.orm import Session

from batchyard.server.auth import context
from batchyard.server.context import ServerContext


def _transaction(ctx: ServerContext = Depends(context)) -> Iterator[Session]:
    with ctx.db.session() as s:
        yield s
    if s.info.get("kick"):
        ctx.kick()


def session(s: Session = Depends(_transaction, scope="function")) -> Session:
    return s
