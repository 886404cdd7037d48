"""Single sign-on for API clients (server.sso): the device flow that `batchyard login` runs,
and the exchange of an ID token a client got by itself. Public routes (a client signing in
has no credential yet), rate-limited and audited like every sign-in: a refused one counts
against the caller's address, and each outcome is in the audit trail."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from batchyard.errors import BatchyardError, RateLimited
from batchyard.server.auth import context
from batchyard.server.context import ServerContext
from batchyard.server.security import authn, ratelimit
from batchyard.server.security.permissions import Public
from batchyard.server.services.audit import Note
from batchyard.server.sso import flows

router = APIRouter(tags=["sign-in"])
T = TypeVar("T")


class PollIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request: str = Field(min_length=8, max_length=4096, description="The handle "
                         "`POST /auth/oidc/device` answered.")


class IdTokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id_token: str = Field(min_length=1, max_length=16384, description="An ID token of this "
                          "server's client, from the OpenID provider.")


def guard(request: Request) -> None:
    """A blocked address is answered 429 before the provider is asked anything."""
    client = authn.client_of(request)
    wait = ratelimit.retry_after(client)
    if wait is not None:
        raise RateLimited(f"too many failed sign-ins from {client}: try again in "
                          f"{wait:.0f} s", details={"retry_after": round(wait)})


async def attempt(request: Request, ctx: ServerContext, action: str,
                  work: Callable[[], T]) -> T:
    """``work()`` in a worker thread; a refusal audited (``auth.failed`` when the caller
    could cause it, which counts against its address; else ``action``)."""
    guard(request)
    try:
        return await run_in_threadpool(work)
    except authn.Refused as exc:
        await authn.failure(request, ctx, exc)
        raise
    except BatchyardError as exc:
        request.state.audit = Note(action=action, client=authn.client_of(request),
                                   target=request.url.path, detail=exc.message)
        raise


@router.post("/auth/oidc/device", dependencies=[Depends(Public(
    "a CLI starts signing in (RFC 8628) before it has any credential"))])
async def device_start(request: Request, ctx: ServerContext = Depends(context)
                       ) -> dict[str, Any]:
    """Start a device sign-in: the answer's ``verification_uri`` and ``user_code`` are for
    the user (in any browser, on any machine), its ``request`` for the polls."""
    client = authn.client_of(request)
    return await attempt(request, ctx, "auth.sso", lambda: flows.device_start(ctx, client))


@router.post("/auth/oidc/device/token", dependencies=[Depends(Public(
    "a CLI polls its device sign-in; the request handle is the credential, checked here"))])
async def device_poll(body: PollIn, request: Request, ctx: ServerContext = Depends(context)
                      ) -> dict[str, Any]:
    """``{"status": "pending", "interval": s}`` until the user has signed in at the
    provider, then ``{"status": "done", "token": …}`` (a login token, shown once)."""
    answer, who = await attempt(request, ctx, "auth.sso",
                                lambda: flows.device_poll(ctx, body.request))
    if who is not None:
        request.state.audit = Note(action="auth.sso", actor=who.name,
                                   credential=f"token:{answer['id']}",
                                   client=authn.client_of(request), target="device")
    return answer


@router.post("/auth/oidc/token", dependencies=[Depends(Public(
    "a client exchanges an ID token for a credential; the ID token is verified here"))])
async def exchange(body: IdTokenIn, request: Request, ctx: ServerContext = Depends(context)
                   ) -> dict[str, Any]:
    """A login token for the user of an ID token of this server's client that a client
    got from the provider by itself (its own flow, as a public client)."""
    answer, who = await attempt(request, ctx, "auth.sso",
                                lambda: flows.exchange(ctx, body.id_token))
    request.state.audit = Note(action="auth.sso", actor=who.name,
                               credential=f"token:{answer['id']}",
                               client=authn.client_of(request), target="id-token")
    return answer
