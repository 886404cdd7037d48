"""Trusting a batchyard server's TLS certificate, with the standard library only.

The node launcher runs with ``python -S`` (no site-packages), so this module must not import
anything outside the standard library or batchyard's other stdlib-only modules. A machine that
does not share the server's home learns the server's private CA either from a file
(``BATCHYARD_CA``) or by pinning its sha256 (``BATCHYARD_CA_SHA256``): the CA is then fetched
once without verification and accepted only if its fingerprint matches the pin, after which
every connection is verified against it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

CA_PATH = "/api/v1/ca.pem"
_BEGIN = "-----BEGIN CERTIFICATE-----"
_END = "-----END CERTIFICATE-----"


class PinMismatch(ValueError):
    """The CA the server offers is not the one pinned: possibly an impostor in the middle."""


def normalize_pin(pin: str) -> str:
    """Accept ``ab12…``, ``AB:12:…`` (openssl's form) and ``sha256:ab12…`` alike."""
    text = pin.strip().lower()
    text = text.removeprefix("sha256:").removeprefix("sha256=")
    return text.replace(":", "").replace(" ", "")


def first_certificate(pem: str) -> str:
    """The first PEM certificate block of ``pem`` (``PEM_cert_to_DER_cert`` takes exactly
    one)."""
    start = pem.find(_BEGIN)
    end = pem.find(_END, start)
    if start < 0 or end < 0:
        raise ValueError("no PEM certificate found")
    return pem[start:end + len(_END)] + "\n"


def fingerprint_pem(pem: str) -> str:
    """Lowercase hex sha256 of the (first) certificate's DER: what ``--ca-sha256`` pins."""
    der = ssl.PEM_cert_to_DER_cert(first_certificate(pem))
    return hashlib.sha256(der).hexdigest()


def _unverified_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def fetch_pinned_ca(server_url: str, pin: str, timeout: float = 10) -> str:
    """Fetch the server's CA without verification and return its PEM only if it matches
    ``pin``; the pin, not the connection, is what makes it trustworthy."""
    want = normalize_pin(pin)
    url = server_url.rstrip("/") + CA_PATH
    req = urllib.request.Request(url, headers={"Accept": "application/x-pem-file"})
    context = _unverified_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            pem = resp.read().decode("ascii", errors="replace")
    except urllib.error.HTTPError as exc:
        raise PinMismatch(f"the server at {server_url} offers no CA to pin "
                          f"(HTTP {exc.code} from {CA_PATH}); is it serving TLS with its "
                          "own CA?") from None
    try:
        got = fingerprint_pem(pem)
    except ValueError:
        raise PinMismatch(f"the server at {server_url} sent something that is not a PEM "
                          "certificate from " + CA_PATH) from None
    if not hmac.compare_digest(got, want):
        raise PinMismatch(f"the CA of the server at {server_url} has sha256 {got[:12]}…, but "
                          f"the pin (BATCHYARD_CA_SHA256) is {want[:12]}…: refusing to trust "
                          "it (wrong pin, re-created CA, or someone in the middle)")
    return first_certificate(pem)


def ssl_context(ca_file: str | None, url: str | None = None) -> ssl.SSLContext | None:
    """A verifying context trusting ``ca_file``; None where the default will do: no CA file
    (system CAs) or a plain-http ``url``."""
    if url is not None and not url.startswith("https:"):
        return None
    if not ca_file:
        return None
    return ssl.create_default_context(cafile=ca_file)


def _decode(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        text = raw.decode("utf-8", errors="replace")[:500]
        return {"error": {"code": "http_error", "message": text}}
    return value if isinstance(value, dict) else {"value": value}


def urlopen_json(method: str, url: str, body: dict[str, Any] | None = None,
                 token: str | None = None, ca_file: str | None = None,
                 timeout: float = 30) -> tuple[int, dict[str, Any]]:
    """One JSON call for stdlib-only clients: returns (status, body) for every HTTP answer,
    4xx/5xx included, so callers decide; connection and TLS trouble raise OSError
    (``urllib.error.URLError``). A non-object JSON answer comes back as ``{"value": …}``."""
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method.upper(), headers=headers)
    context = ssl_context(ca_file, url)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, _decode(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, _decode(exc.read())
        finally:
            exc.close()
