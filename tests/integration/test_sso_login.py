"""Single sign-on with OpenID Connect (issue 32) against a real provider (npm oidc-provider,
tests/oidckit.py) and a real server started with `--oidc-…`: `batchyard login --server URL`
runs the device flow (its code typed in at the provider's page in Chromium, as a person
would), the user is made at the first login, can submit once an owner grants them
`contributor` and not before (403, exit 5); members of the admin group are admins; the
group → role mapping follows the groups at each login; a disabled user cannot sign in;
ID tokens from another key, audience or issuer are refused with a clear 401, never a 500;
each outcome is in the audit trail."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc.jwk import RSAKey

import oidckit
import strictkit
from oidckit import DeviceLogin, OpenIdProvider, Registered, approve_device
from yardkit import Result, Yard

sync_api = strictkit.importorskip("playwright.sync_api")
pytestmark = pytest.mark.timeout(300)
WS, OTHER_WS, CLUSTER = "research", "vision", "c1"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=oidckit.CHROMIUM, args=oidckit.BROWSER_ARGS)
        yield b
        b.close()


@dataclass
class Sso:
    yard: Yard
    provider: OpenIdProvider
    client: Registered
    clients: Path  # a home per person: their own ~/.batchyard, with its credentials file

    def env(self, who: str) -> dict[str, str]:
        home = self.clients / who
        home.mkdir(parents=True, exist_ok=True)
        return {**self.yard.env, "BATCHYARD_HOME": str(home)}

    def cli(self, who: str, *args: str) -> Result:
        """The CLI as ``who`` on their own machine: what their stored login gives."""
        return self.yard.cli(*args, env=self.env(who))

    def login(self, browser: Any, who: str, typed: bool = True) -> Result:
        """`batchyard login --server URL` as ``who``, who signs in at the provider's page
        (typing the printed code, or opening the link that holds it)."""
        run = DeviceLogin(self.env(who), "--server", self.yard.url, cwd=self.yard.work)
        uri, code, full = run.code()
        if typed:
            approve_device(browser, uri, who, code)
        else:
            assert full is not None
            approve_device(browser, full, who)
        return run.finish()

    def api(self, method: str, path: str, token: str | None = None,
            **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, f"{self.yard.url}/api/v1{path}", headers=headers,
                             timeout=30, **kw)

    def token_of(self, who: str) -> str:
        data = json.loads((self.clients / who / "credentials").read_text())
        return str(data["servers"][self.yard.url]["token"])


def sso_flags(provider: OpenIdProvider, client: Registered, secret_file: Path | None,
              *extra: str) -> list[str]:
    flags = ["--oidc-issuer", provider.issuer, "--oidc-client-id", client.client_id]
    if secret_file is not None:
        flags += ["--oidc-client-secret-file", str(secret_file)]
    return [*flags, *extra]


@pytest.fixture(scope="module")
def sso(tmp_path_factory: pytest.TempPathFactory,
        openid_provider: OpenIdProvider) -> Iterator[Sso]:
    port = oidckit.free_port()
    client = openid_provider.register([f"http://127.0.0.1:{port}/login/sso/callback"])
    work = tmp_path_factory.mktemp("work")
    secret_file = work / "client-secret"
    secret_file.write_text(f"{client.secret}\n")
    secret_file.chmod(0o600)
    y = Yard(tmp_path_factory.mktemp("home"), work)
    try:
        y.start_server(port, *sso_flags(openid_provider, client, secret_file,
                                        "--oidc-admin-group", oidckit.ADMINS,
                                        "--oidc-group-role", f"ml-team={OTHER_WS}:reader"))
        for ws in (WS, OTHER_WS):
            y.ok("workspace", "create", ws)
        y.ok("cluster", "create", "-n", CLUSTER, "-w", WS, "-s", "Standard_D2_v2", "-t", "1")
        y.wait_cluster(CLUSTER, 1, workspace=WS)
        yield Sso(y, openid_provider, client, tmp_path_factory.mktemp("people"))
    finally:
        y.stop()


def audit(sso: Sso, **filters: str) -> list[dict[str, Any]]:
    resp = sso.yard.http.get("/audit", params=filters)
    assert resp.status_code == 200, resp.text
    rows: list[dict[str, Any]] = resp.json()
    return rows


def test_the_server_says_it_signs_in_by_sso(sso: Sso) -> None:
    methods = sso.api("GET", "/auth/methods").json()["methods"]
    assert methods[0] == {"kind": "oidc", "flow": "device", "issuer": sso.provider.issuer,
                          "client_id": sso.client.client_id, "portal": "/login/sso"}
    assert {"kind": "token"} in methods
    assert sso.client.secret and sso.client.secret not in json.dumps(methods)


def test_device_login_makes_a_user_who_submits_once_granted_contributor(
        sso: Sso, browser: Any) -> None:
    done = sso.login(browser, "carol")
    assert done.rc == 0, str(done)
    assert f"Logged in to {sso.yard.url} as carol" in done.stdout, str(done)
    assert "enter the code" in done.stderr and "Traceback" not in done.stderr
    creds = sso.clients / "carol" / "credentials"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    assert json.loads(creds.read_text())["current"] == sso.yard.url

    me = json.loads(sso.cli("carol", "whoami", "-o", "json").stdout)
    assert (me["name"], me["admin"], me["sso"], me["roles"]) == ("carol", False, True, [])
    assert me["token"]["kind"] == "login" and me["token"]["expires_at"]
    users = {u["name"]: u for u in sso.yard.js("user", "list")}
    assert users["carol"]["sso"] and users["carol"]["email"] == "carol@example.test"

    job = sso.yard.write_job("by-carol", {"name": "by-carol", "nodes": 1,
                                          "distribution": {"type": "custom"},
                                          "command": "echo hello from carol"})
    refused = sso.cli("carol", "job", "create", "-f", str(job), "-w", WS, "-c", CLUSTER)
    assert refused.rc == 5, str(refused)
    assert "contributor" in refused.stderr and "Traceback" not in refused.stderr
    body = {"spec": {"nodes": 1, "distribution": {"type": "custom"}, "command": "true"},
            "name": "by-carol-api", "cluster": CLUSTER}
    assert sso.api("POST", f"/workspaces/{WS}/jobs", sso.token_of("carol"),
                   json=body).status_code == 403

    sso.yard.ok("role", "assign", "-w", WS, "--user", "carol", "--role", "contributor")
    made = sso.cli("carol", "job", "create", "-f", str(job), "-w", WS, "-c", CLUSTER)
    assert made.rc == 0, str(made)
    ended = sso.yard.wait_job("by-carol", ("succeeded", "failed"), timeout=120, workspace=WS)
    assert (ended["state"], ended["created_by"]) == ("succeeded", "carol")
    logins = audit(sso, user="carol", action="auth.sso")
    assert logins and logins[-1]["outcome"] == "ok" and logins[-1]["target"] == "device"
    assert not any(sso.token_of("carol") in json.dumps(r) for r in audit(sso))


def test_logout_revokes_the_sso_login(sso: Sso, browser: Any) -> None:
    assert sso.login(browser, "frank", typed=False).rc == 0
    token = sso.token_of("frank")
    assert sso.api("GET", "/auth/me", token).status_code == 200
    out = sso.cli("frank", "logout", "-o", "json")
    assert out.rc == 0 and json.loads(out.stdout)["revoked"] is True, str(out)
    assert sso.api("GET", "/auth/me", token).status_code == 401
    # a personal token still signs in where single sign-on is offered
    personal = sso.yard.js("token", "create", "--user", "frank")["token"]
    again = sso.yard.cli("login", "--server", sso.yard.url, "--with-token",
                         env=sso.env("frank"), stdin=personal + "\n")
    assert again.rc == 0 and "as frank" in again.stdout, str(again)
    assert sso.token_of("frank") == personal


def test_members_of_the_admin_group_are_admins(sso: Sso, browser: Any) -> None:
    assert sso.login(browser, "alice").rc == 0
    me = json.loads(sso.cli("alice", "whoami", "-o", "json").stdout)
    assert me["admin"] is True
    assert sso.cli("alice", "user", "list").rc == 0  # an admin's call
    # out of the group at the provider: no admin from the next login on
    sso.provider.set_groups("alice", [])
    try:
        assert sso.login(browser, "alice").rc == 0
        assert json.loads(sso.cli("alice", "whoami", "-o", "json").stdout)["admin"] is False
        assert sso.cli("alice", "user", "list").rc == 5
    finally:
        sso.provider.set_groups("alice", [oidckit.ADMINS])


def test_the_group_role_mapping_applies_at_each_login(sso: Sso, browser: Any) -> None:
    assert sso.login(browser, "bob").rc == 0  # ml-team: reader in OTHER_WS
    roles = {r["workspace"]: r["role"] for r in sso.yard.js("role", "list", "-w", OTHER_WS)
             if r.get("user") == "bob"}
    assert roles == {OTHER_WS: "reader"}
    assert sso.cli("bob", "job", "list", "-w", OTHER_WS).rc == 0
    assert sso.cli("bob", "job", "list", "-w", WS).rc == 5
    # a role given by hand stays whatever the groups say
    sso.yard.ok("role", "assign", "-w", WS, "--user", "bob", "--role", "reader")
    sso.provider.set_groups("bob", [])
    try:
        assert sso.login(browser, "bob").rc == 0
        assert not [r for r in sso.yard.js("role", "list", "-w", OTHER_WS)
                    if r.get("user") == "bob"]
        assert sso.cli("bob", "job", "list", "-w", OTHER_WS).rc == 5
        assert sso.cli("bob", "job", "list", "-w", WS).rc == 0
    finally:
        sso.provider.set_groups("bob", ["ml-team"])


def test_a_disabled_user_cannot_sign_in_by_sso(sso: Sso, browser: Any) -> None:
    assert sso.login(browser, "dave").rc == 0
    sso.yard.ok("user", "disable", "dave")
    assert sso.api("GET", "/auth/me", sso.token_of("dave")).status_code == 401
    again = sso.login(browser, "dave")
    assert again.rc == 2, str(again)
    assert "'dave' is disabled" in again.stderr and "Traceback" not in again.stderr
    failed = [r for r in audit(sso, action="auth.failed") if r["actor"] == "dave"]
    assert failed and "disabled" in failed[-1]["detail"]
    assert failed[-1]["target"] == "/api/v1/auth/oidc/device/token"


def test_a_sign_in_aborted_at_the_provider_is_refused(sso: Sso, browser: Any) -> None:
    run = DeviceLogin(sso.env("judy"), "--server", sso.yard.url, cwd=sso.yard.work)
    uri, code, _ = run.code()
    approve_device(browser, uri, "judy", code, abort=True)
    done = run.finish()
    assert done.rc == 2 and "declined at the OpenID provider" in done.stderr, str(done)
    assert "Traceback" not in done.stderr
    assert not (sso.clients / "judy" / "credentials").exists()
    assert "judy" not in {u["name"] for u in sso.yard.js("user", "list")}


def _refused(resp: httpx.Response, *words: str) -> str:
    assert resp.status_code == 401, (resp.status_code, resp.text)
    message = str(resp.json()["error"]["message"])
    assert message.startswith("the ID token was refused: "), message
    for word in words:
        assert word in message, message
    return message


def test_id_tokens_are_verified(sso: Sso, browser: Any) -> None:
    """The exchange of an ID token a client got by itself: a genuine one of this server's
    client is taken; one signed by another key, for another audience, from another issuer,
    expired, or not a JWT at all is a 401 that says which."""
    provider, client_id = sso.provider, sso.client.client_id
    genuine = provider.device_tokens(browser, "grace", client_id, sso.client.secret)
    ok = sso.api("POST", "/auth/oidc/token", json={"id_token": genuine["id_token"]})
    assert ok.status_code == 200, ok.text
    assert ok.json()["user"] == "grace" and ok.json()["token"].startswith("pat.")

    other_app = provider.device_tokens(browser, "grace")  # a real token, for another client
    _refused(sso.api("POST", "/auth/oidc/token", json={"id_token": other_app["id_token"]}),
             "audience", oidckit.OTHER_CLIENT, client_id)
    impostor = RSAKey.generate_key(2048, private=True)
    forged = provider.sign(provider.claims(client_id), key=impostor)  # the provider's kid
    _refused(sso.api("POST", "/auth/oidc/token", json={"id_token": forged}), "signature",
             "another key")
    unknown = RSAKey.generate_key(2048, parameters={"kid": "not-published"}, private=True)
    _refused(sso.api("POST", "/auth/oidc/token", json={
        "id_token": provider.sign(provider.claims(client_id), key=unknown)}), "not-published")
    elsewhere = provider.claims(client_id, iss="https://login.evil.example")
    _refused(sso.api("POST", "/auth/oidc/token", json={"id_token": provider.sign(elsewhere)}),
             "issued by 'https://login.evil.example'", provider.issuer)
    expired = provider.claims(client_id, exp=1_000_000_000, iat=999_999_000)
    _refused(sso.api("POST", "/auth/oidc/token", json={"id_token": provider.sign(expired)}),
             "expired")
    _refused(sso.api("POST", "/auth/oidc/token", json={"id_token": "not.a.jwt"}), "JWT")
    assert sso.api("POST", "/auth/oidc/token", json={}).status_code == 422
    names = {u["name"] for u in sso.yard.js("user", "list")}
    assert "mallory" not in names  # no refused token made anyone
    failures = [r for r in audit(sso, action="auth.failed")
                if r["target"] == "/api/v1/auth/oidc/token"]
    assert len(failures) >= 6 and all(r["status"] == 401 for r in failures)


def test_a_bogus_device_request_is_refused(sso: Sso) -> None:
    resp = sso.api("POST", "/auth/oidc/device/token", json={"request": "x" * 40})
    assert resp.status_code == 401 and "unknown or has expired" in resp.text, resp.text
    started = sso.api("POST", "/auth/oidc/device").json()
    assert started["user_code"] and started["verification_uri"].startswith(
        sso.provider.issuer)
    pending = sso.api("POST", "/auth/oidc/device/token",
                      json={"request": started["request"]}).json()
    assert pending["status"] == "pending" and pending["interval"] >= 1
