"""The portal's rules: the same roles as the API, for the user a browser signed in as.
Every page and data endpoint declares one (security.permissions finds them in the route
table). A browser without a session is sent to the sign-in page (pages) or answered 401
(data); a missing role is a 403 naming it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from batchyard.errors import AuthError
from batchyard.server.context import ServerContext
from batchyard.server.portal import session as sessions
from batchyard.server.portal.session import LoginRequired, PortalSession
from batchyard.server.security import authn
from batchyard.server.security.permissions import InWorkspace
from batchyard.server.security.principal import Principal, Role


@dataclass(frozen=True)
class Caller:
    """A signed-in browser: its session (the CSRF token) and whom it acts for."""

    sess: PortalSession
    who: Principal

    def workspaces(self, names: list[str]) -> list[str]:
        return [n for n in names if self.who.visible(n)]

    def may_manage(self, ws: str, job: dict[str, Any]) -> bool:
        """Whether the terminate and delete buttons show for this job."""
        role = self.who.role_in(ws)
        if role is None or role < Role.contributor:
            return False
        return role >= Role.owner or job.get("created_by") == self.who.name


def principal_of(ctx: ServerContext, sess: PortalSession) -> Principal:
    """Sync: may read (and on a first call, write) the database."""
    if sess.home_token:
        return authn.home_principal(ctx)
    if sess.user_id is None:
        raise AuthError("this session names no user: sign in again")
    return authn.user_principal(ctx, sess.user_id, "session")


def signed_in(ctx: ServerContext, conn: HTTPConnection) -> tuple[PortalSession | None,
                                                                 Principal | None]:
    """The browser's session and whom it acts for (None: not signed in, or its user is
    disabled or gone). Sync: reads the database."""
    sess = sessions.current(conn)  # type: ignore[arg-type]
    if sess is None:
        return None, None
    try:
        return sess, principal_of(ctx, sess)
    except AuthError:  # a disabled or deleted user: signed out
        return sess, None


class PortalRule(InWorkspace):
    """``role`` (None: any signed-in user) in the page's workspace: its ``ws`` path
    parameter, else its ``ws`` query parameter; ``any_ws``: a page whose workspace is
    optional (none given: it shows one the user may see)."""

    def __init__(self, role: Role | None, *, page: bool, action: str | None = None,
                 own: bool = False, any_ws: bool = False) -> None:
        super().__init__(role or Role.reader, action, own=own)
        self.any_role = role is None
        self.page = page
        self.any_ws = any_ws
        self.label = "portal:" + ("signed-in" if role is None else self.label)

    async def check(self, conn: HTTPConnection) -> Any:
        ctx: ServerContext = conn.app.state.ctx
        sess, who = await run_in_threadpool(signed_in, ctx, conn)
        if sess is None or who is None:
            target = conn.url.path + (f"?{conn.url.query}" if conn.url.query else "")
            raise LoginRequired(target if self.page else conn.url.path, page=self.page)
        given = conn.path_params.get("ws") or conn.query_params.get("ws")
        if not self.any_role and (given or not self.any_ws):
            await self.allow(conn, ctx, who)
        await self.note(conn, who)
        return Caller(sess, who)


class PortalAdmin(PortalRule):
    """A server admin signed in: the usage page, whose report spans every workspace and
    follows the usage report's own rule (``GET /api/v1/usage``: admin)."""

    def __init__(self) -> None:
        super().__init__(None, page=True)
        self.label = "portal:admin"

    async def check(self, conn: HTTPConnection) -> Any:
        caller = await super().check(conn)
        if not caller.who.admin:
            raise self.deny(conn, caller.who, "the usage page needs a server admin; user "
                            f"{caller.who.name!r} is not one", needed="admin")
        return caller
