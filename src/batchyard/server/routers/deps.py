"""Shared router dependencies: one database session (one transaction) per request."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import Depends
from sqlalchemy.orm import Session

from batchyard.server.auth import context
from batchyard.server.context import ServerContext


def session(ctx: ServerContext = Depends(context)) -> Iterator[Session]:
    with ctx.db.session() as s:
        yield s
    if s.info.get("kick"):
        ctx.kick()
