"""Bearer-token authentication for every API route. The admin token lives in
$BATCHYARD_HOME/token (0600); job-scoped tokens (``job.…``) only reach routes that opt in."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select

from batchyard.errors import AuthError
from batchyard.server.context import ServerContext
from batchyard.store.models import Job

_bearer = HTTPBearer(auto_error=False, description="The token in $BATCHYARD_HOME/token")


@dataclass(frozen=True)
class Principal:
    admin: bool
    job_id: int | None = None


def context(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    return ctx


def _token(creds: HTTPAuthorizationCredentials | None) -> str:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise AuthError("missing bearer token: send 'Authorization: Bearer <token>' "
                        "(the token is in $BATCHYARD_HOME/token)")
    return creds.credentials


def require_admin(creds: HTTPAuthorizationCredentials | None = Depends(_bearer),
                  ctx: ServerContext = Depends(context)) -> Principal:
    token = _token(creds)
    if hmac.compare_digest(token.encode(), ctx.admin_token.encode()):
        return Principal(admin=True)
    raise AuthError("invalid token")


def require_any(creds: HTTPAuthorizationCredentials | None = Depends(_bearer),
                ctx: ServerContext = Depends(context)) -> Principal:
    """Admin token, or a job-scoped token (for metrics and run context from inside a job)."""
    token = _token(creds)
    if hmac.compare_digest(token.encode(), ctx.admin_token.encode()):
        return Principal(admin=True)
    if token.startswith("job."):
        digest = hashlib.sha256(token.encode()).hexdigest()
        with ctx.db.session() as session:
            job_id = session.scalar(select(Job.id).where(Job.token_hash == digest))
        if job_id is not None:
            return Principal(admin=False, job_id=job_id)
    raise AuthError("invalid token")
