"""The two sign-in flows' state between their steps (store.sso: a row per flow, used once).

Device flow (the CLI): ``device_start`` asks the provider for a device and a user code and
answers them with a request handle (``<random>.<device code>``: only the CLI holds the
device code); the CLI then polls ``device_poll``, which asks the provider's token endpoint
no more often than the provider allows, and at last verifies the ID token and issues a
login token.

Code flow with PKCE (the portal): ``portal_begin`` makes the state, the nonce and the PKCE
verifier and answers where to send the browser, and the cookie that binds the flow to that
browser (``<random>.<verifier>``); ``portal_finish`` checks the state, the cookie, the
provider's ``iss`` (RFC 9207) and the ID token's nonce, and names the user.

Every refusal the caller could cause (an unknown or expired handle, a declined sign-in, an
ID token that does not verify, a disabled user) is ``Refused``: audited and counted
against the caller's address like a bad token. A refusal by the provider of this server's
own client (its settings) is a plain 401 saying so."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any, NamedTuple
from urllib.parse import urlencode

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from batchyard.errors import AuthError, RateLimited
from batchyard.server.context import ServerContext
from batchyard.server.security.authn import Refused
from batchyard.server.sso import provider_of, signin
from batchyard.server.sso.provider import OAuthError, Provider
from batchyard.store.models import now
from batchyard.store.sso import SsoRequest

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
PORTAL_TTL = 600.0
MAX_DEVICE_TTL = 1800.0
CLIENT_ERRORS = ("invalid_client", "unauthorized_client", "unsupported_grant_type",
                 "invalid_scope")
AGAIN = "run `batchyard login` again"
POLL_SLACK = 0.5  # a client that slept the interval may arrive a little early
MAX_PENDING = 50  # sign-ins in progress per client address (each one costs the provider)


class Who(NamedTuple):
    """The user a flow signed in, as read in its transaction."""

    user_id: int
    name: str
    admin: bool


def _key(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def client_refused(provider: Provider, exc: OAuthError) -> AuthError:
    """The provider refused this server's client: its settings, not the caller."""
    return AuthError(f"the OpenID provider {provider.settings.issuer} refused this server's "
                     f"client {provider.settings.client_id!r} ({exc}): the server's "
                     "--oidc-client-id or its secret is wrong, or the client may not use "
                     "this flow (ask the server's admin)")


def _prune(session: Session) -> None:
    session.execute(delete(SsoRequest).where(SsoRequest.expires < now()))


def _address(client: str | None) -> str | None:
    return client[:64] if client else None


def _room_for(ctx: ServerContext, kind: str, client: str | None) -> None:
    """Refuse a new sign-in from an address that has ``MAX_PENDING`` in progress (they are
    unauthenticated, and each makes the provider work)."""
    if not client:
        return
    with ctx.db.session() as s:
        _prune(s)
        pending = s.scalar(select(func.count()).select_from(SsoRequest).where(
            SsoRequest.kind == kind, SsoRequest.client == _address(client)))
    if (pending or 0) >= MAX_PENDING:
        raise RateLimited(f"{pending} sign-ins are already in progress from {client}: finish "
                          "or abandon them (they expire in minutes)",
                          details={"retry_after": 60})


# --- the device flow ---------------------------------------------------------------------------

def device_start(ctx: ServerContext, client: str | None) -> dict[str, Any]:
    provider = provider_of(ctx)
    _room_for(ctx, "device", client)
    nonce = secrets.token_urlsafe(24)
    try:
        answer = provider.device_authorization(nonce)
    except OAuthError as exc:
        raise client_refused(provider, exc) from None
    code, user_code, uri = (answer.get("device_code"), answer.get("user_code"),
                            answer.get("verification_uri"))
    if not all(isinstance(v, str) and v for v in (code, user_code, uri)):
        raise AuthError(f"the OpenID provider {provider.settings.issuer} answered the device "
                        "authorization without a device code, user code or verification URI")
    interval = _bounded(answer.get("interval"), 5.0, 1.0, 60.0)
    lifetime = _bounded(answer.get("expires_in"), 600.0, 30.0, MAX_DEVICE_TTL)
    handle = f"{secrets.token_urlsafe(24)}.{code}"
    with ctx.db.session() as s:
        s.add(SsoRequest(key_hash=_key(handle), kind="device", nonce=nonce,
                         created_at=now(), expires=now() + lifetime, client=_address(client),
                         interval=interval, next_poll=now() + interval))
    complete = answer.get("verification_uri_complete")
    return {"request": handle, "user_code": user_code, "verification_uri": uri,
            "verification_uri_complete": complete if isinstance(complete, str) else None,
            "expires_in": lifetime, "interval": interval}


def _bounded(value: Any, default: float, low: float, high: float) -> float:
    number = value if isinstance(value, int | float) and not isinstance(value, bool) \
        else default
    return float(min(high, max(low, number)))


def device_poll(ctx: ServerContext, handle: str, via: str = "device"
                ) -> tuple[dict[str, Any], Who | None]:
    """``({"status": "pending", "interval": s}, None)`` while the user has not finished at
    the provider; ``({"status": "done", "token": …}, user)`` once they have."""
    provider = provider_of(ctx)
    key = _key(handle)
    with ctx.db.session() as s:
        row = s.get(SsoRequest, key)
        if row is None or row.kind != "device" or row.expires < now():
            raise Refused(f"this sign-in request is unknown or has expired: {AGAIN}")
        if now() < row.next_poll - POLL_SLACK:
            return {"status": "pending", "interval": row.interval}, None
        row.next_poll = now() + row.interval
        nonce, interval = row.nonce, row.interval
    device_code = handle.partition(".")[2]
    try:
        answer = provider.token({"grant_type": DEVICE_GRANT, "device_code": device_code})
    except OAuthError as exc:
        return _device_error(ctx, provider, key, exc, interval), None
    _forget(ctx, key)
    who = signin.from_tokens(provider, answer, nonce=nonce, nonce_required=False)
    with ctx.db.session() as s:
        user = signin.sign_in(s, provider.settings, who)
        issued = signin.issue(s, provider.settings, user, via)
        signed = Who(user.id, user.name, user.admin)
    return {"status": "done", "token": issued["token"], "id": issued["id"],
            "user": signed.name, "admin": signed.admin, "expires_at": issued["expires_at"]}, signed


def _device_error(ctx: ServerContext, provider: Provider, key: str, exc: OAuthError,
                  interval: float) -> dict[str, Any]:
    if exc.error == "authorization_pending":
        return {"status": "pending", "interval": interval}
    if exc.error == "slow_down":  # RFC 8628 3.5: five seconds more from now on
        with ctx.db.session() as s:
            row = s.get(SsoRequest, key)
            if row is not None:
                row.interval = interval = min(60.0, row.interval + 5)
                row.next_poll = now() + row.interval
        return {"status": "pending", "interval": interval}
    _forget(ctx, key)
    if exc.error in CLIENT_ERRORS:
        raise client_refused(provider, exc)
    if exc.error == "access_denied":
        raise Refused(f"the sign-in was declined at the OpenID provider: {AGAIN} to try "
                      "again")
    if exc.error == "expired_token":
        raise Refused(f"the code was not entered in time (it expired): {AGAIN}")
    raise Refused(f"the OpenID provider refused the sign-in ({exc}): {AGAIN}")


def _forget(ctx: ServerContext, key: str) -> None:
    with ctx.db.session() as s:
        s.execute(delete(SsoRequest).where(SsoRequest.key_hash == key))


# --- an ID token a client got by itself ----------------------------------------------------------

def exchange(ctx: ServerContext, id_token: str) -> tuple[dict[str, Any], Who]:
    """A login token for the user of an ID token that a client got from the provider by
    itself (a public client's own flow); the ID token is verified as the others are."""
    provider = provider_of(ctx)
    claims = signin.verify(provider, id_token)
    who = signin.identity(provider.issuer, claims)
    with ctx.db.session() as s:
        user = signin.sign_in(s, provider.settings, who)
        issued = signin.issue(s, provider.settings, user, "id-token")
        found = Who(user.id, user.name, user.admin)
    return {"token": issued["token"], "id": issued["id"], "user": found.name,
            "admin": found.admin, "expires_at": issued["expires_at"]}, found


# --- the portal's code flow ----------------------------------------------------------------------

def portal_begin(ctx: ServerContext, redirect_uri: str, next_url: str,
                 client: str | None) -> tuple[str, str]:
    """(where to send the browser, the value of its binding cookie)."""
    provider = provider_of(ctx)
    _room_for(ctx, "portal", client)
    state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    verifier = secrets.token_urlsafe(48)  # 64 characters (RFC 7636: 43 to 128)
    cookie = f"{secrets.token_urlsafe(24)}.{verifier}"
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    endpoint = provider.endpoint("authorization_endpoint", "browser sign-in")
    query = urlencode({"response_type": "code", "client_id": provider.settings.client_id,
                       "redirect_uri": redirect_uri, "scope": provider.scopes(),
                       "state": state, "nonce": nonce,
                       "code_challenge": challenge.decode().rstrip("="),
                       "code_challenge_method": "S256"})
    with ctx.db.session() as s:
        s.add(SsoRequest(key_hash=_key(state), kind="portal", nonce=nonce, created_at=now(),
                         expires=now() + PORTAL_TTL, client=_address(client),
                         binding=_key(cookie),
                         redirect_uri=redirect_uri, next_url=next_url))
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}", cookie


def portal_finish(ctx: ServerContext, params: dict[str, str], cookie: str | None
                  ) -> tuple[Who, str]:
    """(the signed-in user, where the browser goes next) from the provider's redirect."""
    provider = provider_of(ctx)
    state = params.get("state") or ""
    with ctx.db.session() as s:
        row = s.get(SsoRequest, _key(state)) if state else None
        if row is None or row.kind != "portal" or row.expires < now():
            raise Refused("this sign-in is unknown or has expired (ten minutes): start "
                          "again from the sign-in page")
        if not cookie or not hmac.compare_digest(_key(cookie), row.binding or ""):
            raise Refused("this sign-in did not start in this browser (its cookie is "
                          "missing): start again from the sign-in page")
        nonce, redirect_uri, next_url = row.nonce, row.redirect_uri or "", row.next_url
        s.delete(row)
    if params.get("error"):
        why = params["error"] + (f": {params['error_description']}"
                                 if params.get("error_description") else "")
        raise Refused(f"the OpenID provider did not sign you in ({why[:300]})")
    if "iss" in params and params["iss"] != provider.issuer:
        raise Refused(f"the answer came from the issuer {params['iss']!r}, not from "
                      f"{provider.issuer!r}: refused (a mix-up)")
    code = params.get("code")
    if not code:
        raise Refused("the OpenID provider's answer holds no authorization code")
    try:
        answer = provider.token({"grant_type": "authorization_code", "code": code,
                                 "redirect_uri": redirect_uri,
                                 "code_verifier": cookie.partition(".")[2]})
    except OAuthError as exc:
        if exc.error in CLIENT_ERRORS:
            raise client_refused(provider, exc) from None
        raise Refused(f"the OpenID provider refused the code ({exc}): start again") from None
    who = signin.from_tokens(provider, answer, nonce=nonce, nonce_required=True)
    with ctx.db.session() as s:
        user = signin.sign_in(s, provider.settings, who)
        found = Who(user.id, user.name, user.admin)
    return found, next_url or "/"
