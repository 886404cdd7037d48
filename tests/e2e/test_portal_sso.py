"""The portal signs in by single sign-on (issue 32): the authorization code flow with PKCE
against a real OpenID provider (npm oidc-provider, tests/oidckit.py), in Debian's Chromium
driven by Playwright: the sign-in page's button, the provider's login and consent pages,
back to the page asked for with a session in the database. Members of the admin group are
admins; a user with no role sees no workspace until one is given; a disabled user is
refused; the state, the browser's cookie and the code are each checked (401 pages, never a
500). Screenshots go to ``test-artifacts/portal/``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

import oidckit
import strictkit
from oidckit import OpenIdProvider, Registered, provider_login
from yardkit import Yard

sync_api = strictkit.importorskip("playwright.sync_api")
pytestmark = pytest.mark.timeout(240)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "portal"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=oidckit.CHROMIUM, args=oidckit.BROWSER_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory,
         openid_provider: OpenIdProvider) -> Iterator[tuple[Yard, Registered]]:
    """A server whose portal signs in through the provider, as a public client (PKCE and
    no secret: the CLI tests use a confidential one)."""
    port = oidckit.free_port()
    client = openid_provider.register([f"http://127.0.0.1:{port}/login/sso/callback"],
                                      secret=False)
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    try:
        y.start_server(port, "--oidc-issuer", openid_provider.issuer, "--oidc-client-id",
                       client.client_id, "--oidc-admin-group", oidckit.ADMINS)
        yield y, client
    finally:
        y.stop()


def sso_sign_in(browser: Any, yard: Yard, login: str, path: str = "/jobs",
                shot: str | None = None) -> Any:
    """A fresh browser signs in by single sign-on, starting from ``path``; its page."""
    context = oidckit.open_context(browser)
    page = context.new_page()
    page.goto(yard.url + path)
    page.wait_for_url(re.compile(re.escape(yard.url) + r"/login\?next="))
    if shot:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / shot))
    page.click("#sso")
    provider_login(page, login)
    return page


def test_the_portal_signs_in_by_sso(browser: Any, site: tuple[Yard, Registered]) -> None:
    yard, _ = site
    page = sso_sign_in(browser, yard, "alice", "/jobs?ws=default", shot="sso-login.png")
    try:
        page.wait_for_url(re.compile(re.escape(yard.url + "/jobs")), timeout=30_000)
        assert page.text_content("#signed-in-as").strip() == "alice (admin)"
        page.screenshot(path=str(ARTIFACTS / "sso-signed-in.png"))
        page.goto(yard.url + "/clusters")  # the session holds
        assert page.url == yard.url + "/clusters"
        cookies = {c["name"]: c for c in page.context.cookies()}
        assert cookies["batchyard_session"]["httpOnly"]
        assert cookies["batchyard_session"]["sameSite"] == "Strict"
        assert "batchyard_sso" not in cookies  # the flow's cookie is gone once used
    finally:
        page.context.close()
    users = {u["name"]: u for u in yard.js("user", "list")}
    assert users["alice"]["sso"] and users["alice"]["admin"]
    logins = [r for r in yard.http.get("/audit", params={"action": "portal.login"}).json()
              if r["actor"] == "alice"]
    assert logins and logins[-1]["credential"] == "sso" and logins[-1]["outcome"] == "ok"


def test_a_user_without_a_role_sees_no_workspace_until_given_one(
        browser: Any, site: tuple[Yard, Registered]) -> None:
    yard, _ = site
    page = sso_sign_in(browser, yard, "henry", "/clusters")
    try:
        page.wait_for_selector("text=has no role in any workspace yet", timeout=30_000)
        yard.ok("role", "assign", "-w", "default", "--user", "henry", "--role", "reader")
        page.goto(yard.url + "/clusters")
        assert page.text_content("#signed-in-as").strip() == "henry"
        assert "no role" not in page.content()
    finally:
        page.context.close()


def test_a_disabled_user_is_refused(browser: Any, site: tuple[Yard, Registered]) -> None:
    yard, _ = site
    first = sso_sign_in(browser, yard, "ivy", "/")
    first.wait_for_selector("text=has no role in any workspace yet", timeout=30_000)
    first.context.close()
    yard.ok("user", "disable", "ivy")
    page = sso_sign_in(browser, yard, "ivy", "/")
    try:
        page.wait_for_selector("#login-error", timeout=30_000)
        assert "'ivy' is disabled" in page.text_content("#login-error")
        assert not any(c["name"] == "batchyard_session" for c in page.context.cookies())
    finally:
        page.context.close()


def _begin(yard: Yard) -> tuple[str, dict[str, list[str]], str]:
    """(the provider's URL, its query, the flow's cookie) of a sign-in begun without a
    browser."""
    resp = httpx.get(yard.url + "/login/sso?next=/jobs", timeout=30)
    assert resp.status_code == 303, resp.text
    location = resp.headers["location"]
    return location, parse_qs(urlsplit(location).query), resp.cookies["batchyard_sso"]


def test_the_code_flow_carries_pkce_state_and_nonce(
        openid_provider: OpenIdProvider, site: tuple[Yard, Registered]) -> None:
    yard, client = site
    location, query, cookie = _begin(yard)
    assert location.startswith(openid_provider.issuer + "/auth?")
    assert query["client_id"] == [client.client_id]
    assert query["redirect_uri"] == [yard.url + "/login/sso/callback"]
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) == 43  # a sha256, base64url without padding
    assert len(query["state"][0]) >= 40 and len(query["nonce"][0]) >= 30
    assert query["scope"] == ["openid profile email groups"]
    verifier = cookie.partition(".")[2]
    assert verifier and verifier not in location  # the verifier stays with the browser


def _callback(yard: Yard, params: dict[str, str], cookie: str | None) -> httpx.Response:
    cookies = {"batchyard_sso": cookie} if cookie else {}
    return httpx.get(yard.url + "/login/sso/callback", params=params, cookies=cookies,
                     timeout=30)


def test_state_cookie_and_code_are_checked(site: tuple[Yard, Registered]) -> None:
    yard, _ = site
    resp = _callback(yard, {"state": "made-up", "code": "x"}, "a.b")
    assert resp.status_code == 401 and "unknown or has expired" in resp.text
    _, query, cookie = _begin(yard)
    state = query["state"][0]
    resp = _callback(yard, {"state": state, "code": "x"}, None)  # another browser
    assert resp.status_code == 401 and "did not start in this browser" in resp.text
    _, query, cookie = _begin(yard)
    resp = _callback(yard, {"state": query["state"][0], "code": "forged"}, cookie)
    assert resp.status_code == 401 and "refused the code" in resp.text, resp.text
    again = _callback(yard, {"state": query["state"][0], "code": "forged"}, cookie)
    assert again.status_code == 401 and "unknown or has expired" in again.text  # used once
    _, query, cookie = _begin(yard)
    resp = _callback(yard, {"state": query["state"][0], "error": "access_denied",
                            "error_description": "<b>no</b>"}, cookie)
    assert resp.status_code == 401 and "access_denied" in resp.text
    assert "<b>no</b>" not in resp.text  # escaped
    assert "batchyard_session" not in resp.cookies
