"""Personal tokens: ``pat.`` and 43 random characters, shown once when made; only the
sha256 is kept, with the first characters (``prefix``) so that a list can tell them apart.
Revoking one, or disabling its user, ends it everywhere at once (security.cache)."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import NotFound, SpecError
from batchyard.server.security import cache
from batchyard.spec.durations import parse_duration
from batchyard.store.identity import ApiToken, User
from batchyard.store.models import now

PREFIX = "pat."
KINDS = ("personal", "login")
MAX_LIFETIME = 10 * 365 * 86400.0


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def expiry(expires: str | float | None, field: str = "expires") -> float | None:
    """When a token made now with ``expires`` (a duration: ``30d``, ``12h``, seconds;
    None or ``never``: it does not expire) expires."""
    if expires is None or (isinstance(expires, str) and expires.strip().lower() in
                           ("", "never", "none")):
        return None
    try:
        seconds = parse_duration(expires)
    except ValueError as exc:
        raise SpecError(f"{field}: {exc} (or 'never')") from None
    if not 0 < seconds <= MAX_LIFETIME:
        raise SpecError(f"{field}: between a second and ten years")
    return now() + seconds


def token_dict(token: ApiToken, user: str) -> dict[str, Any]:
    state = ("revoked" if token.revoked_at is not None else
             "expired" if token.expires_at is not None and token.expires_at <= now() else
             "active")
    return {"id": token.id, "name": token.name, "user": user, "kind": token.kind,
            "prefix": PREFIX + token.prefix, "state": state, "created_at": token.created_at,
            "created_by": token.created_by, "expires_at": token.expires_at,
            "revoked_at": token.revoked_at}


def issue(session: Session, user: User, *, name: str | None, expires: str | float | None,
          kind: str = "personal", by: str | None = None) -> dict[str, Any]:
    """A new token of ``user``; the answer's ``token`` is the only copy there will be."""
    if kind not in KINDS:
        raise SpecError(f"kind: one of {', '.join(KINDS)}")
    name = (name or "").strip() or f"{kind}-{now():.0f}"
    if len(name) > 64 or "\x00" in name:
        raise SpecError("name: at most 64 characters, without NUL bytes")
    secret = secrets.token_urlsafe(32)
    row = ApiToken(user_id=user.id, name=name, kind=kind, token_hash=digest(PREFIX + secret),
                   prefix=secret[:8], created_at=now(), created_by=by,
                   expires_at=expiry(expires))
    session.add(row)
    session.flush()
    return {**token_dict(row, user.name), "token": PREFIX + secret}


def list_tokens(session: Session, user_id: int | None = None) -> list[dict[str, Any]]:
    """The tokens of one user (None: of everyone, for an admin), newest first."""
    query = select(ApiToken, User.name).join(User, User.id == ApiToken.user_id)
    if user_id is not None:
        query = query.where(ApiToken.user_id == user_id)
    return [token_dict(t, name) for t, name in session.execute(query.order_by(
        ApiToken.id.desc()))]


def revoke(session: Session, token_id: int, owner_id: int | None) -> dict[str, Any]:
    """Revoke token ``token_id``: one of ``owner_id``'s (None: anyone's). Idempotent."""
    query = select(ApiToken, User.name).join(User, User.id == ApiToken.user_id).where(
        ApiToken.id == token_id)
    if owner_id is not None:
        query = query.where(ApiToken.user_id == owner_id)
    found = session.execute(query).first()
    if found is None:
        raise NotFound(f"token {token_id} not found among "
                       f"{'your' if owner_id is not None else 'the'} tokens "
                       "(`batchyard token list` shows their ids)")
    token, user = found
    if token.revoked_at is None:
        token.revoked_at = now()
        cache.changed(session)
    return token_dict(token, user)


def owner_of(session: Session, token: str) -> cache.TokenOwner | None:
    """The token's row and user (None: no such token), read for security.authn."""
    row = session.execute(select(ApiToken, User).join(User, User.id == ApiToken.user_id)
                          .where(ApiToken.token_hash == digest(token))).first()
    if row is None:
        return None
    tok, user = row
    return cache.TokenOwner(token_id=tok.id, user_id=user.id, name=user.name, admin=user.admin,
                            service=user.service, user_disabled=user.disabled_at is not None,
                            revoked_at=tok.revoked_at, expires_at=tok.expires_at)
