"""The OpenID provider as this server talks to it: its discovery document and signing keys
(fetched when first needed and kept a while, so a provider that is down when the server
starts does not stop the server), and the calls single sign-on makes: the device
authorization (RFC 8628), the token endpoint and userinfo. The client authenticates with
its secret when it has one (HTTP Basic, else in the form, as the provider supports).

A provider that does not answer is a 502 naming it (try again later). Settings that cannot
work are a 401 that says which: no OpenID provider at the issuer URL, one that names
another issuer, one that refuses this server's client id (the sign-in is refused, and the
message tells the caller to ask the server's admin)."""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import quote

import httpx
from joserfc.jwk import KeySet

from batchyard.errors import AuthError, BackendError
from batchyard.server.sso.settings import OidcSettings

METADATA_TTL = 3600.0
KEYS_TTL = 3600.0
KEYS_REFRESH_MIN = 30.0  # an unknown key id fetches the keys again, at most this often
TIMEOUT = 10.0
MAX_ANSWER = 256 * 1024
WANTED_SCOPES = ("profile", "email", "groups")
SAFE_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
             "ES512", "EdDSA", "Ed25519")


class OAuthError(Exception):
    """The provider answered an OAuth error (``error``: its code, RFC 6749 section 5.2)."""

    def __init__(self, error: str, description: str, status: int) -> None:
        super().__init__(f"{error}: {description}" if description else error)
        self.error = error
        self.description = description
        self.status = status


class Provider:
    """One per server process (``ServerContext.oidc``); safe to use from worker threads."""

    def __init__(self, settings: OidcSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = 0.0
        self._keys: KeySet | None = None
        self._keys_at = 0.0
        self._http = httpx.Client(timeout=TIMEOUT, follow_redirects=False,
                                  headers={"Accept": "application/json"})

    def close(self) -> None:
        self._http.close()

    # discovery and keys ------------------------------------------------------------------------

    @property
    def issuer(self) -> str:
        """The issuer exactly as the provider spells it (what ``iss`` must equal)."""
        return str(self.metadata()["issuer"])

    def metadata(self) -> dict[str, Any]:
        with self._lock:
            if self._metadata is not None and time.time() - self._metadata_at < METADATA_TTL:
                return self._metadata
        configured = self.settings.issuer
        found = self._get_json(configured.rstrip("/") + "/.well-known/openid-configuration",
                               "its discovery document")
        said = found.get("issuer")
        if not isinstance(said, str) or said.rstrip("/") != configured.rstrip("/"):
            raise AuthError(f"the OpenID provider at {configured} names its issuer "
                               f"{said!r}, not {configured!r}: the server's --oidc-issuer is "
                               "wrong (ask the server's admin)")
        for name in ("jwks_uri", "token_endpoint"):
            if not isinstance(found.get(name), str):
                raise AuthError(f"the OpenID provider at {configured} publishes no {name} "
                                "in its discovery document")
        with self._lock:
            self._metadata, self._metadata_at = found, time.time()
        return found

    def endpoint(self, name: str, what: str) -> str:
        url = self.metadata().get(name)
        if not isinstance(url, str) or not url:
            raise AuthError(f"the OpenID provider {self.settings.issuer} offers no {what} "
                            f"({name}): sign in with a personal token instead")
        return url

    def keys(self, refresh: bool = False) -> KeySet:
        """The provider's public signing keys; ``refresh``: fetch them again (a key id not
        among them: the provider may have rotated its keys), at most every few seconds."""
        with self._lock:
            age = time.time() - self._keys_at
            if self._keys is not None and age < KEYS_TTL and (not refresh or
                                                              age < KEYS_REFRESH_MIN):
                return self._keys
        found = self._get_json(str(self.metadata()["jwks_uri"]), "its signing keys (JWKS)")
        try:
            keys = KeySet.import_key_set(found)  # type: ignore[arg-type]
        except Exception as exc:  # joserfc says why in several exception types
            raise AuthError(f"the OpenID provider {self.settings.issuer} publishes signing "
                            f"keys that cannot be read ({exc})") from None
        with self._lock:
            self._keys, self._keys_at = keys, time.time()
        return keys

    def algorithms(self) -> list[str]:
        """The signature algorithms an ID token may use: the provider's, among the
        asymmetric ones (never ``none``, never a shared-secret HMAC)."""
        said = self.metadata().get("id_token_signing_alg_values_supported") or ["RS256"]
        return [a for a in said if a in SAFE_ALGS] or ["RS256"]

    def scopes(self) -> str:
        """``openid`` and what of profile, email and groups the provider says it has."""
        said = self.metadata().get("scopes_supported")
        offered = set(said) if isinstance(said, list) else {"profile", "email"}
        return " ".join(["openid", *(s for s in WANTED_SCOPES if s in offered)])

    # the calls ---------------------------------------------------------------------------------

    def device_authorization(self, nonce: str) -> dict[str, Any]:
        url = self.endpoint("device_authorization_endpoint", "device sign-in (RFC 8628)")
        return self._post(url, {"scope": self.scopes(), "nonce": nonce})

    def token(self, form: dict[str, str]) -> dict[str, Any]:
        return self._post(str(self.metadata()["token_endpoint"]), form)

    def userinfo(self, access_token: str) -> dict[str, Any]:
        """The user's claims at the userinfo endpoint ({} when there is none)."""
        url = self.metadata().get("userinfo_endpoint")
        if not isinstance(url, str) or not access_token:
            return {}
        try:
            resp = self._http.get(url, headers={"Authorization": f"Bearer {access_token}"})
        except httpx.HTTPError as exc:
            raise self._unreachable("its userinfo endpoint", exc) from None
        if resp.status_code != 200:
            return {}  # the ID token's own claims are then all there is
        return self._json(resp, "its userinfo endpoint")

    def _post(self, url: str, form: dict[str, str]) -> dict[str, Any]:
        """A form POST to the provider with this client's authentication; its JSON answer,
        or OAuthError with the provider's error."""
        body = dict(form)
        auth: httpx.BasicAuth | None = None
        secret = self.settings.secret
        if secret is None:
            body["client_id"] = self.settings.client_id
        elif "client_secret_basic" in (self.metadata().get(
                "token_endpoint_auth_methods_supported") or ["client_secret_basic"]):
            # RFC 6749 2.3.1: each part form-urlencoded before the Basic encoding
            auth = httpx.BasicAuth(quote(self.settings.client_id, safe=""),
                                   quote(secret, safe=""))
        else:
            body.update(client_id=self.settings.client_id, client_secret=secret)
        try:
            resp = (self._http.post(url, data=body, auth=auth) if auth is not None
                    else self._http.post(url, data=body))
        except httpx.HTTPError as exc:
            raise self._unreachable(url, exc) from None
        data = self._json(resp, url, strict=False)
        if resp.status_code >= 400 or "error" in data:
            raise OAuthError(str(data.get("error") or f"HTTP {resp.status_code}"),
                             str(data.get("error_description") or "")[:300], resp.status_code)
        return data

    def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            resp = self._http.get(url)
        except httpx.HTTPError as exc:
            raise self._unreachable(what, exc) from None
        if resp.status_code != 200:
            raise AuthError(f"no OpenID provider answers at {self.settings.issuer}: HTTP "
                            f"{resp.status_code} for {what} ({url}); the server's "
                            "--oidc-issuer may be wrong (ask the server's admin)")
        return self._json(resp, what)

    def _json(self, resp: httpx.Response, what: str, strict: bool = True) -> dict[str, Any]:
        try:
            data = resp.json() if len(resp.content) <= MAX_ANSWER else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            if not strict and resp.status_code >= 400:
                return {}
            raise AuthError(f"no OpenID provider answers at {self.settings.issuer}: "
                            f"{what} is not a JSON object; the server's --oidc-issuer may "
                            "be wrong (ask the server's admin)")
        return data

    def _unreachable(self, what: str, exc: Exception) -> BackendError:
        return BackendError(f"the OpenID provider {self.settings.issuer} did not answer "
                            f"({what}: {type(exc).__name__}): try again later, or ask the "
                            "server's admin")
