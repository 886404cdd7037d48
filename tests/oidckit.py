"""A real OpenID provider for the single sign-on tests: npm's ``oidc-provider`` (a certified
OpenID Connect implementation), installed by scripts/setup.sh into .cache/oidc-provider,
started by the tests on a free port of 127.0.0.1 (tests/data/oidc/provider.mjs) and stopped
by pid. Its signing keys are made here, so a test can also sign what the provider would
not (a token for another issuer, an expired one) and tell each check of the server apart.

Its browser pages (the device page, the login form that takes any login, the consent form)
are driven with Playwright in Debian's Chromium, as a person would; `batchyard login` runs
as a real process whose printed code a test reads (``DeviceLogin``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from joserfc import jwt
from joserfc.jwk import RSAKey

from yardkit import Result

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / ".cache" / "oidc-provider" / "node_modules" / "oidc-provider" / "lib" / \
    "index.js"
SCRIPT = ROOT / "tests" / "data" / "oidc" / "provider.mjs"
CHROMIUM = os.environ.get("BATCHYARD_CHROMIUM", "/usr/bin/chromium")
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
GRANTS = ["authorization_code", DEVICE_GRANT, "refresh_token"]
OTHER_CLIENT = "another-app"  # a public client of the provider that is not batchyard
ADMINS = "ml-admins"
ACCOUNTS: dict[str, dict[str, Any]] = {  # anyone else signs in too, with no groups
    "alice": {"email": "alice@example.test", "name": "Alice", "groups": [ADMINS]},
    "bob": {"email": "bob@example.test", "name": "Bob", "groups": ["ml-team"]},
}


def missing() -> str | None:
    """Why the provider cannot run here (None: it can)."""
    if shutil.which("node") is None:
        return "node is not installed (scripts/setup.sh installs it with npm)"
    if not MODULE.is_file():
        return "oidc-provider is not installed (scripts/setup.sh: .cache/oidc-provider)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (scripts/setup.sh installs it)"
    return None


@dataclass
class Registered:
    """A client registered at the provider (RFC 7591)."""

    client_id: str
    secret: str | None


@dataclass
class OpenIdProvider:
    folder: Path
    accounts: dict[str, dict[str, Any]]
    key: RSAKey = field(default_factory=lambda: RSAKey.generate_key(
        2048, parameters={"kid": "test-signing-1", "use": "sig", "alg": "RS256"},
        private=True))
    issuer: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def conf(self) -> Path:
        return self.folder / "conf.json"

    def _write_conf(self) -> None:
        clients = [{"client_id": OTHER_CLIENT, "token_endpoint_auth_method": "none",
                    "grant_types": [DEVICE_GRANT], "response_types": [],
                    "redirect_uris": []}]
        data = {"clients": clients, "accounts": self.accounts,
                "jwks": {"keys": [self.key.as_dict(private=True)]}}
        tmp = self.conf.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.conf)

    def start(self, timeout: float = 30) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._write_conf()
        log = open(self.folder / "provider.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(["node", str(SCRIPT), str(MODULE), str(self.conf)],
                                     stdout=subprocess.PIPE, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.stop()
                raise AssertionError(f"oidc-provider did not start in {timeout}s: "
                                     f"{(self.folder / 'provider.log').read_text()[-2000:]}")
        line = self.proc.stdout.readline().decode()
        if not line.strip():
            self.stop()
            raise AssertionError("oidc-provider exited: "
                                 f"{(self.folder / 'provider.log').read_text()[-2000:]}")
        self.issuer = json.loads(line)["issuer"]
        httpx.get(self.issuer + "/.well-known/openid-configuration", timeout=10)\
            .raise_for_status()

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def set_groups(self, login: str, groups: list[str]) -> None:
        """Change someone's groups at the provider (their next sign-in says so)."""
        self.accounts.setdefault(login, {"email": f"{login}@example.test", "name": login})
        self.accounts[login]["groups"] = groups
        self._write_conf()

    def register(self, redirect_uris: list[str], secret: bool = True) -> Registered:
        """A new client of the provider, as an admin registers batchyard there."""
        body = {"redirect_uris": redirect_uris, "grant_types": GRANTS,
                "response_types": ["code"], "client_name": "batchyard",
                "token_endpoint_auth_method": "client_secret_basic" if secret else "none"}
        resp = httpx.post(self.issuer + "/reg", json=body, timeout=10)
        assert resp.status_code == 201, resp.text
        data = resp.json()
        return Registered(data["client_id"], data.get("client_secret"))

    # tokens the provider signs, and tokens it would not ------------------------------------

    def device_tokens(self, browser: Any, login: str, client_id: str = OTHER_CLIENT,
                      secret: str | None = None) -> dict[str, Any]:
        """The provider's own answer (ID token and all) to a device sign-in of ``login``
        for ``client_id``, run by this test against the provider directly."""
        auth = (client_id, secret) if secret else None
        form = {} if secret else {"client_id": client_id}
        started = httpx.post(self.issuer + "/device/auth", auth=auth, timeout=10,
                             data={**form, "scope": "openid profile email groups"}).json()
        approve_device(browser, started["verification_uri_complete"], login)
        answer = httpx.post(self.issuer + "/token", auth=auth, timeout=10, data={
            **form, "grant_type": DEVICE_GRANT, "device_code": started["device_code"]})
        assert answer.status_code == 200, answer.text
        data: dict[str, Any] = answer.json()
        return data

    def sign(self, claims: dict[str, Any], key: RSAKey | None = None) -> str:
        """A JWT signed with the provider's own key (or ``key``), with the key id of the
        provider's key unless ``key`` has its own."""
        key = key or self.key
        header = {"alg": "RS256", "kid": key.kid or self.key.kid}
        return jwt.encode(header, claims, key)

    def claims(self, client_id: str, sub: str = "mallory", **extra: Any) -> dict[str, Any]:
        stamp = int(time.time())
        return {"iss": self.issuer, "aud": client_id, "sub": sub, "iat": stamp,
                "exp": stamp + 600, **extra}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def open_context(browser: Any) -> Any:
    return browser.new_context(viewport={"width": 1280, "height": 800})


def approve_device(browser: Any, url: str, login: str, code: str | None = None,
                   abort: bool = False) -> None:
    """A person at the provider's device page: the code typed in (``code``; else ``url``
    holds it), confirmed, then log in and consent (``abort``: they abort instead)."""
    context = open_context(browser)
    try:
        page = context.new_page()
        page.goto(url)
        if code is not None:
            page.fill("input[name=user_code]", code)
            page.locator("button[form='op.deviceInputForm']").click()
        page.wait_for_selector("text=Confirm Device", timeout=30_000)
        if abort:
            page.locator("button[name=abort]").click()
            page.wait_for_load_state()
            return
        page.locator("button[autofocus]").click()  # "Continue": the code is the one shown
        provider_login(page, login)
        page.wait_for_selector("text=Sign-in Success", timeout=30_000)
    finally:
        context.close()


def provider_login(page: Any, login: str) -> None:
    """The provider's login form (devInteractions: any login, any password), then its
    consent form."""
    page.wait_for_selector("input[name=login]", timeout=30_000)
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any")
    page.locator("button[type=submit]").first.click()
    consent = "form:has(input[name=prompt][value=consent]) button[type=submit]"
    page.wait_for_selector(consent, timeout=30_000)
    page.locator(consent).click()


CODE_LINE = re.compile(r"open the page (\S+) and enter the code (\S+) to authenticate")
FULL_URL = re.compile(r"\(or open (\S+), which holds the code\)")


class DeviceLogin:
    """`batchyard login --server URL` running (``env``: its environment): what it printed,
    read as it comes, and its end."""

    def __init__(self, env: dict[str, str], *args: str, cwd: Path | None = None) -> None:
        self.args = ("login", *args)
        self.proc = subprocess.Popen([sys.executable, "-m", "batchyard.cli.main",
                                      *self.args], env=env, cwd=str(cwd) if cwd else None,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.err: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)

    def code(self, timeout: float = 60) -> tuple[str, str, str | None]:
        """(verification URI, user code, the URI holding the code) once printed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = "".join(self.err)
            found = CODE_LINE.search(text)
            if found:
                full = FULL_URL.search(text)
                return found[1], found[2], full[1] if full else None
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no device code printed: {self.finish(5)}")

    def finish(self, timeout: float = 120) -> Result:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.stdout.close()
        self._reader.join(5)
        return Result(self.args, self.proc.returncode, out or "", "".join(self.err))
