"""Validating an ID token (OpenID Connect Core 1.0, section 3.1.3.7): its signature against
the provider's published keys (joserfc does the cryptography), then its claims: ``iss`` is
the provider, ``aud`` holds this server's client id (and ``azp`` names it when there are
several audiences), ``exp`` is not past, ``iat`` is not in the future, ``sub`` names
someone, and ``nonce`` is the one this server sent (when it sent one: required in the code
flow; in the device flow, where providers may leave it out, checked when present). Each
refusal says what was wrong."""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from joserfc import jwt
from joserfc.errors import BadSignatureError, InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet
from joserfc.jws import extract_compact

from batchyard.server.security.authn import Refused

LEEWAY = 60  # seconds of clock difference tolerated between the provider and this server
MAX_TOKEN = 16 * 1024


class InvalidIdToken(Refused):
    """An ID token this server does not accept: 401, saying why (audited and counted
    against the caller's address, as a bad token is)."""

    def __init__(self, why: str) -> None:
        super().__init__(f"the ID token was refused: {why}", credential="sso")


def verify(token: str, *, keys: Callable[[bool], KeySet], issuer: str, client_id: str,
           algorithms: Sequence[str], nonce: str | None = None, nonce_required: bool = False,
           now: float | None = None) -> dict[str, Any]:
    """The claims of ``token`` once it is valid, else InvalidIdToken. ``keys(refresh)``:
    the provider's keys (``refresh``: fetched again, for a key id not among them)."""
    header = _header(token)
    alg = header.get("alg")
    if alg not in algorithms:
        raise InvalidIdToken(f"it is signed with {alg!r}; this server accepts "
                             f"{', '.join(algorithms)} (the provider's own)")
    claims = _signed_claims(token, keys, list(algorithms), header)
    check_claims(claims, issuer=issuer, client_id=client_id, nonce=nonce,
                 nonce_required=nonce_required, now=time.time() if now is None else now)
    return claims


def _header(token: str) -> dict[str, Any]:
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN:
        raise InvalidIdToken("not a JWT (expected a compact JWS of at most 16 KiB)")
    try:
        header = extract_compact(token.encode()).protected
    except (JoseError, ValueError, TypeError):
        raise InvalidIdToken("not a JWT (expected three base64url parts: header, claims, "
                             "signature)") from None
    if not isinstance(header, dict):
        raise InvalidIdToken("its header is not a JSON object")
    return header


def _signed_claims(token: str, keys: Callable[[bool], KeySet], algorithms: list[str],
                   header: dict[str, Any]) -> dict[str, Any]:
    for refresh in (False, True):
        try:
            claims = jwt.decode(token, keys(refresh), algorithms=algorithms).claims
        except InvalidKeyIdError:
            if refresh:
                raise InvalidIdToken(f"it is signed by a key the provider does not publish "
                                     f"(kid {header.get('kid')!r} is not in its JWKS)") from None
            continue
        except BadSignatureError:
            raise InvalidIdToken("its signature does not verify against the provider's "
                                 "published keys (JWKS): it was signed by another key")\
                from None
        except (JoseError, ValueError, TypeError, json.JSONDecodeError) as exc:
            raise InvalidIdToken(f"it cannot be verified ({_said(exc)})") from None
        if not isinstance(claims, dict):
            raise InvalidIdToken("its claims are not a JSON object")
        return claims
    raise InvalidIdToken("it cannot be verified")  # not reached: the loop returns or raises


def check_claims(claims: dict[str, Any], *, issuer: str, client_id: str, nonce: str | None,
                 nonce_required: bool, now: float) -> None:
    """The claims' checks alone (the signature was verified before)."""
    iss = claims.get("iss")
    if iss != issuer:
        raise InvalidIdToken(f"it was issued by {iss!r}; this server trusts the provider "
                             f"{issuer!r} (--oidc-issuer)")
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if client_id not in audiences:
        raise InvalidIdToken(f"it was issued for the audience {aud!r}, not for this server's "
                             f"client {client_id!r} (--oidc-client-id)")
    azp = claims.get("azp")
    if (len(audiences) > 1 or azp is not None) and azp != client_id:
        raise InvalidIdToken(f"it was issued to the party {azp!r}, not to this server's "
                             f"client {client_id!r}")
    exp, iat, nbf = _time(claims, "exp"), _time(claims, "iat"), _time(claims, "nbf")
    if exp is None:
        raise InvalidIdToken("it has no expiry time (exp)")
    if exp + LEEWAY < now:
        raise InvalidIdToken(f"it expired {now - exp:.0f} s ago (exp)")
    if iat is None:
        raise InvalidIdToken("it has no issue time (iat)")
    if iat - LEEWAY > now:
        raise InvalidIdToken("it was issued in the future (iat): check the clocks")
    if nbf is not None and nbf - LEEWAY > now:
        raise InvalidIdToken("it is not valid yet (nbf)")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > 255:
        raise InvalidIdToken("it names no subject (sub)")
    said = claims.get("nonce")
    if nonce is None:  # a token the client got by itself: its nonce was the client's
        return
    if nonce_required and said is None:
        raise InvalidIdToken("it carries no nonce, and this sign-in sent one")
    if said is not None and (not isinstance(said, str) or
                             not hmac.compare_digest(said.encode(), nonce.encode())):
        raise InvalidIdToken("its nonce is not the one this sign-in sent (a replayed or "
                             "mixed-up token)")


def _time(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _said(exc: Exception) -> str:
    text = getattr(exc, "description", None) or str(exc) or type(exc).__name__
    return str(text)[:200]
