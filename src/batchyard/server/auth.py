"""Bearer-token authentication for every API route. The admin token lives in
$BATCHYARD_HOME/token (0600); job-scoped tokens (``job.…``) only reach routes that opt in,
only while their job has not ended (a token of an ended job is 401, like no token), and only
their own job (services.metrics answers the same for another job and for one that does not
exist)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from batchyard.errors import AuthError
from batchyard.server.context import ServerContext
from batchyard.states import JOB_TERMINAL
from batchyard.store.models import Job

_bearer = HTTPBearer(auto_error=False, description="The token in $BATCHYARD_HOME/token")


@dataclass(frozen=True)
class Principal:
    admin: bool
    job_id: int | None = None


def server_context(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    return ctx


async def context(request: Request) -> ServerContext:
    """The dependency. Async, like the checks below: what needs no database runs on the
    event loop (a sync dependency costs a trip to a worker thread on every request)."""
    return server_context(request)


def _token(creds: HTTPAuthorizationCredentials | None) -> str:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise AuthError("missing bearer token: send 'Authorization: Bearer <token>' "
                        "(the token is in $BATCHYARD_HOME/token)")
    return creds.credentials


def _is_admin(token: str, ctx: ServerContext) -> bool:
    return hmac.compare_digest(token.encode(), ctx.admin_token.encode())


class _TokenCheck(HTTPBearer):
    """The bearer scheme and the token check as one dependency. FastAPI solves every
    dependency in a pass of its own (its parameters, its cache, its sub-dependencies): the
    scheme, the context and the check as three cost a request about as much as its
    route's own work on a small answer. As an ``HTTPBearer`` it still names the scheme in
    the OpenAPI document."""

    def __init__(self, *, jobs: bool) -> None:
        super().__init__(auto_error=False, scheme_name="HTTPBearer",
                         description="The token in $BATCHYARD_HOME/token")
        self.jobs = jobs

    async def __call__(self, request: Request) -> Principal:  # type: ignore[override]
        ctx = server_context(request)
        token = _token(await super().__call__(request))
        if _is_admin(token, ctx):
            return Principal(admin=True)
        if self.jobs and token.startswith("job."):
            return await run_in_threadpool(_job_principal, ctx, token)  # reads the database
        raise AuthError("invalid token")


require_admin = _TokenCheck(jobs=False)
# Admin token, or a job-scoped token (for metrics and run context from inside a job).
require_any = _TokenCheck(jobs=True)


def principal_of(creds: HTTPAuthorizationCredentials | None, ctx: ServerContext) -> Principal:
    """``require_any``'s answer, called directly (not a dependency)."""
    token = _token(creds)
    if _is_admin(token, ctx):
        return Principal(admin=True)
    return _job_principal(ctx, token)


def _job_principal(ctx: ServerContext, token: str) -> Principal:
    if not token.startswith("job."):
        raise AuthError("invalid token")
    digest = hashlib.sha256(token.encode()).hexdigest()
    with ctx.db.session() as session:
        row = session.execute(select(Job.id, Job.state)
                              .where(Job.token_hash == digest)).first()
    if row is not None and row[1] not in JOB_TERMINAL:
        return Principal(admin=False, job_id=row[0])
    if row is not None:
        raise AuthError("this job token has expired: its job has ended")
    raise AuthError("invalid token")
