"""One-time sign-in links (``batchyard portal --open``), as Jupyter's ``?token=`` link: the
CLI asks the API for a link with its user's credential; the browser that opens it first is
signed in as that user (a portal session, as the sign-in form makes) and sent on to the page
asked for.

The link's token is not the caller's token and stands for nothing else: 32 random bytes, kept
only as its sha256, deleted by its first visit (across a server's processes: the first to
delete the row wins) and refused after ``LIFETIME`` seconds. A refused link gets the sign-in
page, saying why."""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import delete

from batchyard.server.auth import context
from batchyard.server.context import ServerContext
from batchyard.server.portal import session as sessions
from batchyard.server.security.permissions import Person, Public
from batchyard.server.security.principal import Principal
from batchyard.store.db import Database
from batchyard.store.models import PortalLink

LIFETIME = 120.0  # seconds a link may wait for its visit
PATH = "/signin"

api = APIRouter(tags=["portal"])  # under /api/v1, behind the bearer token
pages = APIRouter(include_in_schema=False)


class LinkIn(BaseModel):
    next: str = Field("/", max_length=2048, description="The portal page to land on.")


@api.post("/portal/sign-in-links", status_code=201)
def create_link(body: LinkIn | None = None,
                who: Principal = Depends(Person("portal.link")),
                ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    """A one-time link that signs a browser in to the portal as the caller: ``path`` (with
    its token) on this server, valid for one visit within ``expires_in`` seconds."""
    token = make(ctx.db, (body or LinkIn()).next, user_id=who.user_id,
                 home_token=who.credential == "home-token")
    return {"path": f"{PATH}?{urlencode({'token': token})}", "expires_in": LIFETIME}


def make(db: Database, next_url: str, lifetime: float = LIFETIME, *,
         user_id: int | None = None, home_token: bool = False) -> str:
    token = secrets.token_urlsafe(32)
    now = time.time()
    with db.session() as session:
        session.execute(delete(PortalLink).where(PortalLink.expires < now))
        session.add(PortalLink(token_hash=_hash(token), next_url=sessions.safe_next(next_url),
                               expires=now + lifetime, user_id=user_id,
                               home_token=home_token))
        session.commit()
    return token


def consume(db: Database, token: str) -> tuple[str, int | None, bool] | None:
    """The page a link leads to and whom it signs in (user id, home token), once: None for
    a token never made, used or expired."""
    if not token or len(token) > 128:
        return None
    with db.session() as session:
        row = session.get(PortalLink, _hash(token))
        if row is None:
            return None
        found = (row.next_url, row.user_id, row.home_token)
        fresh = row.expires >= time.time()
        gone = session.execute(delete(PortalLink).where(PortalLink.token_hash == row.token_hash))
        session.commit()
    return found if fresh and getattr(gone, "rowcount", 0) == 1 else None


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pages.get(PATH, dependencies=[Depends(Public(
    "a one-time link's visit: its own token decides (consumed once, then refused)"))])
async def sign_in(request: Request, token: str = "") -> Response:
    ctx: ServerContext = request.app.state.ctx
    found = await run_in_threadpool(consume, ctx.db, token)
    if found is None:
        from batchyard.server.portal.pages import render

        return render("login.html", request, None, 401, next="/",
                      error="This sign-in link has been used already or has expired: run "
                      "`batchyard portal --open` again for a new one, or sign in with the "
                      "token below.")

    target, user_id, home_token = found

    def start() -> sessions.PortalSession:  # a fresh session, whatever this browser had
        sessions.store(request).drop(request.cookies.get(sessions.COOKIE))
        return sessions.store(request).create(user_id, home_token)

    sess = await run_in_threadpool(start)
    response = RedirectResponse(target, status_code=303)
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    sessions.set_cookie(request, response, sess)
    return response
