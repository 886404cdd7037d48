"""Signing in (`batchyard login`, `logout`, `whoami`) and one's own personal tokens."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path
from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import AuthError
from batchyard.server.auth import context
from batchyard.server.context import ServerContext
from batchyard.server.routers.deps import INT32_MAX, CommitRoute, session
from batchyard.server.routers.identity import TokenIn
from batchyard.server.security.permissions import Person, Public, SignedIn
from batchyard.server.security.principal import Principal
from batchyard.server.services import identities, roles, tokens
from batchyard.store.identity import ApiToken, User

router = APIRouter(tags=["sign-in"], route_class=CommitRoute)
SIGNED_IN = SignedIn()


@router.get("/auth/methods", dependencies=[Depends(Public(
    "a client asks how to sign in before it has a credential"))])
async def methods(ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    """How a client may sign in here: with a personal token always, and with whatever
    single sign-on adds (`batchyard login` picks from these)."""
    return {"methods": ctx.login_methods}


def me(s: Session, who: Principal) -> dict[str, Any]:
    """Who the caller is, as the server sees it, and where they hold which role."""
    user = s.get(User, who.user_id) if who.user_id is not None else None
    data: dict[str, Any] = {"name": who.name, "email": user.email if user else None,
                            "admin": who.admin, "service": who.service,
                            "credential": who.credential, "sso": bool(user and user.issuer)}
    if who.credential.startswith("token:"):
        token = s.get(ApiToken, int(who.credential.split(":", 1)[1]))
        if token is not None:
            data["token"] = tokens.token_dict(token, who.name)
    data["roles"] = ([] if who.user_id is None else roles.listing_for(s, who.user_id))
    data["teams"] = identities.show_user(s, who.name)["teams"] if user else []
    return data


@router.get("/auth/me")
def whoami(s: Session = Depends(session), who: Principal = Depends(SIGNED_IN)
           ) -> dict[str, Any]:
    return me(s, who)


@router.post("/auth/login")
def login(s: Session = Depends(session), who: Principal = Depends(Person("auth.login"))
          ) -> dict[str, Any]:
    """A client signing in with this credential (`batchyard login`): recorded in the audit
    trail, and answered with who it is."""
    return me(s, who)


@router.post("/auth/logout")
def logout(s: Session = Depends(session), who: Principal = Depends(SignedIn("auth.logout"))
           ) -> dict[str, Any]:
    """Signing out: a token a sign-in flow made for this client (kind ``login``) is revoked;
    a personal token stays valid (it may be in use elsewhere)."""
    revoked = False
    if who.credential.startswith("token:"):
        token_id = int(who.credential.split(":", 1)[1])
        kind = s.scalar(select(ApiToken.kind).where(ApiToken.id == token_id))
        if kind == "login":
            tokens.revoke(s, token_id, who.user_id)
            revoked = True
    return {"name": who.name, "revoked": revoked}


@router.post("/tokens", status_code=201)
def create_token(body: TokenIn, s: Session = Depends(session),
                 who: Principal = Depends(SignedIn("token.create",
                                                   target=lambda p, b: b.get("name")))
                 ) -> dict[str, Any]:
    """A personal token of the caller's own, shown once (``token``)."""
    if who.user_id is None:
        raise AuthError("this credential belongs to no user")
    return tokens.issue(s, identities.find_user(s, who.name), name=body.name,
                        expires=body.expires, by=who.name)


@router.get("/tokens")
def list_tokens(all: bool = False, s: Session = Depends(session),
                who: Principal = Depends(SIGNED_IN)) -> list[dict[str, Any]]:
    """The caller's own tokens; ``all`` (an admin): everyone's."""
    return tokens.list_tokens(s, None if (all and who.admin) else who.user_id)


@router.delete("/tokens/{token_id}")
def revoke_token(token_id: int = Path(ge=1, le=INT32_MAX), s: Session = Depends(session),
                 who: Principal = Depends(SignedIn("token.revoke"))) -> dict[str, Any]:
    """One of the caller's own tokens (an admin: anyone's). It stops working at once."""
    return tokens.revoke(s, token_id, None if who.admin else who.user_id)
