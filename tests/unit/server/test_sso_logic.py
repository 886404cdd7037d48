"""Single sign-on's pure logic: the `--oidc-…` flags and their round trips to the detached
server (argv) and to each worker (spec); the ID token's claims checks, each refusal saying
which claim; the user's claims from the ID token and userinfo. (The signature checks and the
flows run against a real OpenID provider: tests/integration/test_sso_*.py.)"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet, OctKey, RSAKey

from batchyard.errors import AuthError, SpecError
from batchyard.server.main import sso_flags
from batchyard.server.sso import idtoken, signin
from batchyard.server.sso.settings import OidcSettings, parse

ISS, CLIENT = "https://login.example.org/realms/ml", "batchyard"


def test_the_flags_round_trip_to_the_server_and_its_workers(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("  s3cret \n")
    made = parse(ISS, "batchyard", str(secret), ["admins", "ops"],
                 ["ml team=research:contributor", "x:y=vision:reader"], "12h")
    assert made is not None and made.secret == "s3cret"
    assert made.group_roles == (("ml team", "research", "contributor"),
                                ("x:y", "vision", "reader"))
    assert made.roles_by_group() == {"ml team": [("research", "contributor")],
                                     "x:y": [("vision", "reader")]}
    parser = argparse.ArgumentParser()
    sso_flags(parser)
    args = parser.parse_args(made.argv())
    again = parse(args.oidc_issuer, args.oidc_client_id, args.oidc_client_secret_file,
                  args.oidc_admin_group, args.oidc_group_role, args.oidc_login_lifetime)
    assert again == made and again.login_lifetime == 12 * 3600
    assert OidcSettings.from_spec(made.to_spec()) == made
    assert "s3cret" not in repr(made) and "s3cret" not in str(made.to_spec())
    assert parse(None, None) is None


@pytest.mark.parametrize(("args", "said"), [
    ((None, "x"), "--oidc-client-id needs --oidc-issuer"),
    ((ISS, None), "needs --oidc-client-id"),
    (("http://10.0.0.5/realms/ml", "x"), "use https"),
    (("https://l.example.org#x", "x"), "no query or fragment"),
    ((ISS, "x", None, None, ["ml=bad name:reader"]), "GROUP=WORKSPACE:ROLE"),
    ((ISS, "x", None, None, ["=ws:reader"]), "GROUP=WORKSPACE:ROLE"),
    ((ISS, "x", None, None, None, "100d"), "between a minute and 90 days"),
    ((ISS, "x", None, None, None, "soon"), "--oidc-login-lifetime"),
])
def test_bad_flags_name_the_flag(args: tuple[Any, ...], said: str) -> None:
    with pytest.raises(SpecError, match=said):
        parse(*args)


def test_loopback_may_be_plain_http(tmp_path: Path) -> None:
    for issuer in ("http://127.0.0.1:9000", "http://localhost:9000/", "http://[::1]:9000"):
        found = parse(issuer, "x")
        assert found is not None and found.issuer == issuer
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SpecError, match="client secret on one line"):
        parse(ISS, "x", str(empty))


def claims(**extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": ISS, "aud": CLIENT, "sub": "u1", "iat": now, "exp": now + 300, **extra}


def check(found: dict[str, Any], nonce: str | None = None, required: bool = False) -> None:
    idtoken.check_claims(found, issuer=ISS, client_id=CLIENT, nonce=nonce,
                         nonce_required=required, now=time.time())


# made when each case runs, not at collection: a long run checks them 40 minutes later
@pytest.mark.parametrize(("made", "said"), [
    (lambda: claims(iss="https://evil.example"), "issued by 'https://evil.example'"),
    (lambda: claims(aud="other"), "audience 'other'"),
    (lambda: claims(aud=[CLIENT, "other"]), "issued to the party None"),
    (lambda: claims(aud=[CLIENT, "other"], azp="other"), "issued to the party 'other'"),
    (lambda: claims(azp="other"), "issued to the party 'other'"),
    (lambda: claims(exp=int(time.time()) - 600), "expired"),
    (lambda: claims(exp="tomorrow"), "no expiry time"),
    (lambda: claims(iat=int(time.time()) + 3600), "in the future"),
    (lambda: claims(iat=None), "no issue time"),
    (lambda: claims(nbf=int(time.time()) + 3600), "not valid yet"),
    (lambda: claims(sub=""), "names no subject"),
    (lambda: claims(exp=True), "no expiry time"),
])
def test_each_claim_is_checked(made: Callable[[], dict[str, Any]], said: str) -> None:
    with pytest.raises(idtoken.InvalidIdToken, match=said):
        check(made())


def test_the_nonce_where_one_was_sent() -> None:
    check(claims(aud=[CLIENT, "x"], azp=CLIENT))  # several audiences, azp names us
    check(claims(nonce="n1"), nonce="n1", required=True)
    check(claims(), nonce="n1")  # device flow: a provider may leave it out
    check(claims(nonce="anything"))  # a token the client got by itself: not ours to check
    with pytest.raises(idtoken.InvalidIdToken, match="carries no nonce"):
        check(claims(), nonce="n1", required=True)
    with pytest.raises(idtoken.InvalidIdToken, match="nonce is not the one"):
        check(claims(nonce="n2"), nonce="n1")
    with pytest.raises(idtoken.InvalidIdToken, match="nonce is not the one"):
        check(claims(nonce=7), nonce="n1")


def test_verify_refuses_what_is_not_signed_by_an_accepted_algorithm() -> None:
    key = RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)
    keys = KeySet([key])
    good = jwt.encode({"alg": "RS256", "kid": "k1"}, claims(), key)

    def verify(token: str, algs: tuple[str, ...] = ("RS256",)) -> dict[str, Any]:
        return idtoken.verify(token, keys=lambda refresh: keys, issuer=ISS, client_id=CLIENT,
                              algorithms=algs)

    assert verify(good)["sub"] == "u1"
    with pytest.raises(idtoken.InvalidIdToken, match="signed with 'RS256'; this server "
                       "accepts ES256"):
        verify(good, ("ES256",))
    shared = jwt.encode({"alg": "HS256"}, claims(), OctKey.import_key("x" * 32))
    with pytest.raises(idtoken.InvalidIdToken, match="'HS256'"):
        verify(shared)
    with pytest.raises(idtoken.InvalidIdToken, match="not a JWT"):
        verify("x" * 20_000)
    assert isinstance(idtoken.InvalidIdToken("x"), AuthError)


def test_the_users_claims_come_from_the_id_token_and_userinfo() -> None:
    found = signin.identity(ISS, {"sub": "u1"}, {"sub": "u1", "email": "ann@example.org",
                                                "groups": ["a", "b", "a", 3, None]})
    assert (found.subject, found.email, found.name_hint, found.groups) == (
        "u1", "ann@example.org", "ann", ("a", "b", "3"))
    stranger = signin.identity(ISS, {"sub": "u1", "preferred_username": "ann"},
                               {"sub": "someone-else", "groups": ["admins"]})
    assert stranger.groups == () and stranger.name_hint == "ann"
    assert signin.identity(ISS, {"sub": "u9", "groups": "solo"}).groups == ("solo",)
    assert signin.identity(ISS, {"sub": "u9"}).name_hint == "u9"
