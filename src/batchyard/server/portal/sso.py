"""Signing in to the portal by single sign-on (server.sso): the authorization code flow
with PKCE. ``/login/sso`` sends the browser to the provider with a fresh state, nonce and
code challenge, and a cookie that binds the flow to this browser; the provider sends it
back to ``/login/sso/callback``, where the code is exchanged, the ID token verified and a
portal session made as the token sign-in makes one.

The session cookie is SameSite=Strict, which a browser does not send on the navigations
of a redirect chain that began at another site (the provider). So the callback answers a
page that moves on by itself (a meta refresh: a navigation from this site) instead of a
redirect, and the next page finds its session."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from batchyard.errors import BatchyardError
from batchyard.server.auth import server_context
from batchyard.server.context import ServerContext
from batchyard.server.portal import session as sessions
from batchyard.server.portal.pages import render
from batchyard.server.routers.sso import guard
from batchyard.server.security import authn
from batchyard.server.security.permissions import Public
from batchyard.server.services.audit import Note
from batchyard.server.sso import NOT_CONFIGURED, flows

router = APIRouter(include_in_schema=False)
COOKIE = "batchyard_sso"
PATH = "/login/sso"
CALLBACK = PATH + "/callback"


def _failed(request: Request, exc: BatchyardError, next_url: str = "/") -> Response:
    return render("login.html", request, None, exc.http_status, next=next_url,
                  error=exc.message)


@router.get(PATH, dependencies=[Depends(Public("signing in: the browser leaves for the "
                                               "OpenID provider"))])
async def begin(request: Request, next: str = "/") -> Response:
    ctx: ServerContext = server_context(request)
    target = sessions.safe_next(next)
    if ctx.oidc is None:
        return render("login.html", request, None, 404, next=target, error=NOT_CONFIGURED)
    redirect_uri = str(request.base_url).rstrip("/") + CALLBACK
    client = authn.client_of(request)
    try:
        guard(request)
        url, cookie = await run_in_threadpool(flows.portal_begin, ctx, redirect_uri, target,
                                              client)
    except BatchyardError as exc:
        request.state.audit = Note(action="portal.login", client=client, credential="sso",
                                   target=PATH, detail=exc.message)
        return _failed(request, exc, target)
    response = RedirectResponse(url, status_code=303)
    response.set_cookie(COOKIE, cookie, max_age=int(flows.PORTAL_TTL), path=PATH,
                        httponly=True, samesite="lax", secure=request.url.scheme == "https")
    return response


@router.get(CALLBACK, dependencies=[Depends(Public("the OpenID provider sends the browser "
                                                   "back; state, cookie and code are checked "
                                                   "here"))])
async def callback(request: Request) -> Response:
    ctx: ServerContext = server_context(request)
    params = {k: v[:4096] for k, v in request.query_params.items()}
    client = authn.client_of(request)
    try:
        guard(request)
        who, target = await run_in_threadpool(flows.portal_finish, ctx, params,
                                              request.cookies.get(COOKIE))
    except authn.Refused as exc:
        await authn.failure(request, ctx, exc)
        return _failed(request, exc)
    except BatchyardError as exc:
        request.state.audit = Note(action="portal.login", client=client, credential="sso",
                                   target=CALLBACK, detail=exc.message)
        return _failed(request, exc)

    def sign_in() -> sessions.PortalSession:
        sessions.store(request).drop(request.cookies.get(sessions.COOKIE))
        return sessions.store(request).create(who.user_id, False)

    sess = await run_in_threadpool(sign_in)
    request.state.audit = Note(action="portal.login", actor=who.name, credential="sso",
                               client=client)
    target = sessions.safe_next(target)
    response = render("continue.html", request, None, target=target)
    sessions.set_cookie(request, response, sess)
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="lax",
                           secure=request.url.scheme == "https")
    return response

