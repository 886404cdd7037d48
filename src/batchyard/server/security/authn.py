"""Credentials to principals. A bearer token is one of:

* the home's token (``$BATCHYARD_HOME/token``): the server's OS user, an admin, made a user
  on first use (the embedded default needs no sign-in);
* a personal token (``pat.…``) of a user or service account;
* a job token (``job.…``), only on the routes that take one, acting for its own job;
* a node's or a launcher's credential, only on the node channel's routes (rules there).

A personal token's user and roles come from ``security.cache``: no database round trip on a
known token. Failed authentications are noted for the audit trail and rate-limited per
client address (``security.ratelimit``)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from sqlalchemy import select
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from batchyard.errors import AuthError, RateLimited
from batchyard.server.context import ServerContext
from batchyard.server.security import cache, ratelimit
from batchyard.server.security.principal import Principal, Role
from batchyard.server.services.audit import Note
from batchyard.states import JOB_TERMINAL
from batchyard.store.identity import User
from batchyard.store.models import Experiment, Job, Workspace, now

HOME = "home-token"
MISSING = ("missing bearer token: send 'Authorization: Bearer <token>' (a personal token, "
           "or the token in $BATCHYARD_HOME/token)")
OTHER_KINDS = ("node.", "launch.", "join.")


class Refused(AuthError):
    """A presented credential that is not valid: counted for rate limiting and audited."""

    def __init__(self, message: str, actor: str = "anonymous",
                 credential: str | None = None) -> None:
        super().__init__(message)
        self.actor = actor
        self.credential = credential


def bearer(authorization: str | None) -> str | None:
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def client_of(request: Any) -> str | None:
    client = getattr(request, "client", None)
    return client.host if client is not None else None


def is_home_token(ctx: ServerContext, token: str) -> bool:
    return hmac.compare_digest(token.encode(), ctx.admin_token.encode())


def home_principal(ctx: ServerContext) -> Principal:
    """The home's token as its user; that user is made on the first call (in a worker
    thread: it may write)."""
    if ctx.owner is None:
        from batchyard.server.services.identities import ensure_owner, os_user_name

        with ctx.db.session() as s:
            user = ensure_owner(s, os_user_name())
            ctx.owner = Principal(admin=True, name=user.name, user_id=user.id,
                                  credential=HOME)
    owner: Principal = ctx.owner
    return owner


def personal_principal(ctx: ServerContext, token: str) -> Principal:
    """Sync (it may read the database); ``personal_cached`` first, on the event loop."""
    from batchyard.server.services import tokens

    key = hashlib.sha256(token.encode()).hexdigest()
    seen = cache.principals.generation

    def load() -> cache.TokenOwner | None:
        with ctx.db.session() as s:
            return tokens.owner_of(s, token)

    found = cache.cached(cache.tokens, key, load)
    who = _checked(ctx, found)
    assert found is not None
    cache.principals.put(key, (who, found.expires_at), seen)
    return who


def personal_cached(ctx: ServerContext, token: str) -> Principal | None:
    """The principal from the cache alone (None: the database must be asked): one hash
    and one lookup for a token seen before."""
    key = hashlib.sha256(token.encode()).hexdigest()
    hit = cache.principals.get(key)
    if hit is not None and (hit[1] is None or hit[1] > now()):
        return hit[0]
    seen = cache.principals.generation
    found = cache.tokens.get(key)
    if found is None:
        return None
    held = None if found.admin else cache.roles.get(found.user_id)
    if held is None and not found.admin:
        return None
    who = _checked(ctx, found, held)
    cache.principals.put(key, (who, found.expires_at), seen)
    return who


def _checked(ctx: ServerContext, found: cache.TokenOwner | None,
             held: dict[str, Role] | None = None) -> Principal:
    if found is None:
        raise Refused("invalid token: no such personal token (revoked tokens are kept: this "
                      "one never existed here)")
    credential = f"token:{found.token_id}"
    if found.revoked_at is not None:
        raise Refused(f"this token (id {found.token_id}, user {found.name!r}) was revoked; "
                      "make a new one (`batchyard token create`)", found.name, credential)
    if found.expires_at is not None and found.expires_at <= now():
        raise Refused(f"this token (id {found.token_id}, user {found.name!r}) has expired; "
                      "make a new one (`batchyard token create`)", found.name, credential)
    if found.user_disabled:
        raise Refused(f"user {found.name!r} is disabled: ask a server admin "
                      "(`batchyard user enable`)", found.name, credential)
    if held is None and not found.admin:
        held = roles_of(ctx, found.user_id)
    return Principal(admin=found.admin, name=found.name, user_id=found.user_id,
                     service=found.service, credential=credential, roles=held or {})


def roles_of(ctx: ServerContext, user_id: int) -> dict[str, Role]:
    from batchyard.server.services import roles

    def load() -> dict[str, Role]:
        with ctx.db.session() as s:
            return roles.effective(s, user_id)

    return cache.cached(cache.roles, user_id, load) or {}


def user_principal(ctx: ServerContext, user_id: int, credential: str) -> Principal:
    """A signed-in user by id (a portal session), checked as a token's user is."""
    def load() -> cache.TokenOwner | None:
        with ctx.db.session() as s:
            user = s.get(User, user_id)
            if user is None:
                return None
            return cache.TokenOwner(0, user.id, user.name, user.admin, user.service,
                                    user.disabled_at is not None, None, None)

    found = cache.cached(cache.users, user_id, load)
    if found is None:
        raise AuthError("the user of this session no longer exists: sign in again")
    if found.user_disabled:
        raise AuthError(f"user {found.name!r} is disabled: ask a server admin")
    return Principal(admin=found.admin, name=found.name, user_id=found.user_id,
                     service=found.service, credential=credential,
                     roles={} if found.admin else roles_of(ctx, found.user_id))


_JOB_OF_TOKEN = (select(Job.id, Job.state, Workspace.name, Experiment.name, Job.name)
                 .join(Workspace, Workspace.id == Job.workspace_id)
                 .join(Experiment, Experiment.id == Job.experiment_id))


def job_principal(ctx: ServerContext, token: str) -> Principal:
    digest = hashlib.sha256(token.encode()).hexdigest()
    with ctx.db.session() as session:
        row = session.execute(_JOB_OF_TOKEN.where(Job.token_hash == digest)).first()
    if row is not None and row[1] not in JOB_TERMINAL:
        return Principal(kind="job", job_id=row[0], name=f"job:{row[0]}",
                         credential=f"job:{row[0]}", job_path=(row[2], row[3], row[4]))
    if row is not None:
        raise AuthError("this job token has expired: its job has ended")
    raise Refused("invalid token")


def resolve(ctx: ServerContext, token: str, *, jobs: bool) -> Principal:
    """Sync: the principal of ``token`` (may read the database)."""
    if is_home_token(ctx, token):
        return home_principal(ctx)
    if token.startswith("pat."):
        return personal_principal(ctx, token)
    if token.startswith("job."):
        if jobs:
            return job_principal(ctx, token)
        raise AuthError("a job token reaches only its own job's metrics, tags and exec: "
                        "this route needs a user's token")
    if token.startswith(OTHER_KINDS):
        raise AuthError("a node's credential acts only on its node's own routes: this "
                        "route needs a user's token")
    raise Refused("invalid token")


async def authenticate(request: HTTPConnection, ctx: ServerContext, *, jobs: bool,
                       token: str | None = None) -> Principal:
    """The caller of ``request`` (async: a cached token costs no worker thread)."""
    client = client_of(request)
    wait = ratelimit.retry_after(client)
    if wait is not None:
        raise RateLimited(f"too many failed sign-ins from {client}: try again in "
                          f"{wait:.0f} s", details={"retry_after": round(wait)})
    token = token if token is not None else bearer(request.headers.get("authorization"))
    if token is None:
        raise AuthError(MISSING)
    if ctx.owner is not None and is_home_token(ctx, token):
        owner: Principal = ctx.owner
        return owner
    if token.startswith("pat."):
        try:
            found = personal_cached(ctx, token)
        except Refused as exc:
            await failure(request, ctx, exc)
            raise
        if found is not None:
            return found
    try:
        return await run_in_threadpool(resolve, ctx, token, jobs=jobs)
    except Refused as exc:
        await failure(request, ctx, exc)
        raise


async def failure(request: Any, ctx: ServerContext, exc: Refused) -> None:
    """A presented credential was refused: noted for the audit trail (its outcome comes with
    the answer) and counted against the caller's address."""
    client = client_of(request)
    state = getattr(request, "state", None)
    if state is not None:
        state.audit = Note(action="auth.failed", actor=exc.actor, credential=exc.credential,
                           client=client, target=request.url.path, detail=exc.message)
    if not client:
        return
    if ratelimit.recent_here(client) + 1 >= ratelimit.LIMIT:
        ratelimit.failed(client)
        return

    def count() -> int:
        from batchyard.server.services import audit

        with ctx.db.session() as s:
            return audit.failures_from(s, client, now() - ratelimit.WINDOW)

    try:
        elsewhere = await run_in_threadpool(count)
    except Exception:  # a database in trouble must not turn a 401 into a 500
        elsewhere = 0
    ratelimit.failed(client, elsewhere)
