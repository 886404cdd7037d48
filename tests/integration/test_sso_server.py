"""Single sign-on's settings on a real server (issue 32): bad `--oidc-…` flags are exit 2
naming the flag before anything starts; a server whose client id or issuer is wrong refuses
sign-ins with a clear 401 (a provider that does not answer: a 502), never a 500; failed SSO
sign-ins are rate-limited per address; and with `--workers` every server process signs
people in the same way (PostgreSQL)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psutil
import pytest

import oidckit
import strictkit
from oidckit import DeviceLogin, OpenIdProvider, approve_device
from yardkit import Yard

sync_api = strictkit.importorskip("playwright.sync_api")
pytestmark = pytest.mark.timeout(300)
LIMIT = 6  # failed sign-ins per address and minute on this module's server


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    """A home whose server each test starts with its own flags."""
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env["BATCHYARD_AUTH_FAILURES"] = str(LIMIT)
    try:
        yield y
    finally:
        y.stop()


def restart(y: Yard, *flags: str) -> None:
    y.cli("server", "stop")
    y.start_server(0, *flags)


def login(y: Yard, tmp: Any) -> Any:
    env = {**y.env, "BATCHYARD_HOME": str(tmp)}
    return y.cli("login", "--server", y.url, env=env, timeout=60)


BAD_FLAGS = [
    (["--oidc-client-id", "x"], "--oidc-client-id needs --oidc-issuer"),
    (["--oidc-issuer", "https://login.example.org"], "needs --oidc-client-id"),
    (["--oidc-issuer", "ftp://login.example.org", "--oidc-client-id", "x"], "--oidc-issuer"),
    (["--oidc-issuer", "http://login.example.org", "--oidc-client-id", "x"], "use https"),
    (["--oidc-issuer", "https://login.example.org?x=1", "--oidc-client-id", "x"],
     "no query"),
    (["--oidc-issuer", "https://l.example.org", "--oidc-client-id", "x",
      "--oidc-group-role", "ml-team"], "GROUP=WORKSPACE:ROLE"),
    (["--oidc-issuer", "https://l.example.org", "--oidc-client-id", "x",
      "--oidc-group-role", "ml=research:admin"], "'admin' is not a role"),
    (["--oidc-issuer", "https://l.example.org", "--oidc-client-id", "x",
      "--oidc-client-secret-file", "/nonexistent/secret"], "cannot be read"),
    (["--oidc-issuer", "https://l.example.org", "--oidc-client-id", "x",
      "--oidc-login-lifetime", "5s"], "--oidc-login-lifetime"),
    (["--oidc-issuer", "https://l.example.org", "--oidc-client-id", "x",
      "--oidc-admin-group", " "], "--oidc-admin-group"),
]


@pytest.mark.parametrize(("flags", "said"), BAD_FLAGS)
def test_bad_flags_are_refused_naming_the_flag(yard: Yard, flags: list[str], said: str
                                               ) -> None:
    yard.cli("server", "stop")
    run = yard.cli("server", "start", "--port", "0", *flags)
    assert run.rc == 2, str(run)
    assert said in run.stderr and "Traceback" not in run.stderr, str(run)
    assert not (yard.home / "server.json").exists()


def test_the_client_secret_never_shows(yard: Yard, openid_provider: OpenIdProvider) -> None:
    secret = yard.work / "secret"
    secret.write_text("s3cret-never-shown\n")
    restart(yard, "--oidc-issuer", openid_provider.issuer, "--oidc-client-id", "x",
            "--oidc-client-secret-file", str(secret))
    server = psutil.Process(yard.server_pid)
    assert "s3cret-never-shown" not in " ".join(server.cmdline())
    assert "s3cret-never-shown" not in (yard.home / "server.log").read_text()
    methods = httpx.get(yard.url + "/api/v1/auth/methods", timeout=10).text
    assert "s3cret" not in methods and openid_provider.issuer in methods


def test_a_wrong_client_id_is_a_clear_401(yard: Yard, openid_provider: OpenIdProvider,
                                          tmp_path: Any) -> None:
    restart(yard, "--oidc-issuer", openid_provider.issuer, "--oidc-client-id", "nope")
    resp = httpx.post(yard.url + "/api/v1/auth/oidc/device", timeout=30)
    assert resp.status_code == 401, resp.text
    message = resp.json()["error"]["message"]
    assert "refused this server's client 'nope'" in message and "invalid_client" in message
    run = login(yard, tmp_path)
    assert run.rc == 2 and "client 'nope'" in run.stderr, str(run)
    assert "Traceback" not in run.stderr
    entries = yard.http.get("/audit", params={"action": "auth.sso"}).json()
    assert entries and entries[-1]["status"] == 401 and "nope" in entries[-1]["detail"]


def test_a_wrong_issuer_is_a_clear_error(yard: Yard, openid_provider: OpenIdProvider,
                                         tmp_path: Any) -> None:
    restart(yard, "--oidc-issuer", openid_provider.issuer + "/nothing-here",
            "--oidc-client-id", "x")
    resp = httpx.post(yard.url + "/api/v1/auth/oidc/device", timeout=30)
    assert resp.status_code == 401 and "no OpenID provider answers at" in resp.text, resp.text
    run = login(yard, tmp_path)
    assert run.rc == 2 and "no OpenID provider answers" in run.stderr, str(run)
    # the provider names itself 127.0.0.1; a server told "localhost" is told so
    renamed = openid_provider.issuer.replace("127.0.0.1", "localhost")
    restart(yard, "--oidc-issuer", renamed, "--oidc-client-id", "x")
    resp = httpx.post(yard.url + "/api/v1/auth/oidc/device", timeout=30)
    assert resp.status_code == 401 and "names its issuer" in resp.text, resp.text
    # nothing listens there: the provider is away, a 502 (try again later)
    restart(yard, "--oidc-issuer", f"http://127.0.0.1:{oidckit.free_port()}",
            "--oidc-client-id", "x")
    resp = httpx.post(yard.url + "/api/v1/auth/oidc/device", timeout=30)
    assert resp.status_code == 502 and "did not answer" in resp.text, resp.text
    assert "single sign-on:" in (yard.home / "server.log").read_text()  # said at start


def test_sso_is_off_without_the_flags(yard: Yard) -> None:
    restart(yard)
    methods = httpx.get(yard.url + "/api/v1/auth/methods", timeout=10).json()["methods"]
    assert methods == [{"kind": "token"}]
    resp = httpx.post(yard.url + "/api/v1/auth/oidc/device", timeout=10)
    assert resp.status_code == 404 and "not configured" in resp.text
    page = httpx.get(yard.url + "/login", timeout=10).text
    assert 'id="sso"' not in page and 'id="token"' in page


def test_sign_ins_in_progress_are_capped_per_address(
        yard: Yard, openid_provider: OpenIdProvider) -> None:
    from batchyard.server.sso.flows import MAX_PENDING

    client = openid_provider.register(["http://127.0.0.1:9/login/sso/callback"], secret=False)
    restart(yard, "--oidc-issuer", openid_provider.issuer, "--oidc-client-id",
            client.client_id)
    url = yard.url + "/api/v1/auth/oidc/device"
    with httpx.Client(timeout=30) as http:
        codes = [http.post(url).status_code for _ in range(MAX_PENDING + 1)]
    assert codes == [200] * MAX_PENDING + [429], codes
    assert httpx.get(yard.url + "/login/sso", timeout=10).status_code == 303  # not these


def test_failed_sso_sign_ins_are_rate_limited(yard: Yard, openid_provider: OpenIdProvider
                                              ) -> None:
    restart(yard, "--oidc-issuer", openid_provider.issuer, "--oidc-client-id", "x")
    url = yard.url + "/api/v1/auth/oidc/token"
    codes = [httpx.post(url, json={"id_token": f"bad.{i}.token"}, timeout=10).status_code
             for i in range(LIMIT + 2)]
    assert codes[:LIMIT - 1] == [401] * (LIMIT - 1) and codes[-1] == 429, codes
    blocked = httpx.post(yard.url + "/api/v1/auth/oidc/device", timeout=10)
    assert blocked.status_code == 429 and blocked.headers["Retry-After"]
    page = httpx.get(yard.url + "/login/sso", timeout=10)
    assert page.status_code == 429 and "too many failed sign-ins" in page.text


# --- every process of a --workers server -----------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=oidckit.CHROMIUM, args=oidckit.BROWSER_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory, openid_provider: OpenIdProvider,
            postgres_database: Callable[[], str]) -> Iterator[Yard]:
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env["BATCHYARD_DB_URL"] = postgres_database()
    port = oidckit.free_port()
    client = openid_provider.register([f"http://127.0.0.1:{port}/login/sso/callback"])
    secret = y.work / "secret"
    secret.write_text(str(client.secret))
    try:
        y.start_server(port, "--workers", "2", "--oidc-issuer", openid_provider.issuer,
                       "--oidc-client-id", client.client_id, "--oidc-client-secret-file",
                       str(secret), "--oidc-admin-group", oidckit.ADMINS)
        yield y
    finally:
        y.stop()


def _answered_by(y: Yard, path: str) -> tuple[int, dict[str, Any]]:
    """(the pid of the server process that took a fresh connection, its JSON answer): the
    connection is kept open until its owner is found among the server's processes."""
    port = int(y.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        mine = sock.getsockname()[1]
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(body) < length:
            body += sock.recv(65536)
        owner = 0
        server = psutil.Process(y.server_pid)
        for proc in [server, *server.children()]:
            try:
                if any(c.raddr and c.raddr.port == mine for c in proc.net_connections("tcp")):
                    owner = proc.pid
            except psutil.Error:
                continue
    assert b" 200 " in head.split(b"\r\n")[0], head
    return owner, json.loads(body)


def test_every_worker_signs_in_by_sso(workers: Yard, browser: Any, tmp_path: Any,
                                      openid_provider: OpenIdProvider) -> None:
    seen: dict[int, list[dict[str, Any]]] = {}
    for _ in range(40):
        pid, answer = _answered_by(workers, "/api/v1/auth/methods")
        seen.setdefault(pid, []).append(answer["methods"][0])
        if len([p for p in seen if p]) == 2:
            break
    pids = [p for p in seen if p]
    assert len(pids) == 2, f"connections reached only {pids}"
    for answers in seen.values():
        assert all(m["kind"] == "oidc" and m["issuer"] == openid_provider.issuer
                   for m in answers)
    run = DeviceLogin({**workers.env, "BATCHYARD_HOME": str(tmp_path)}, "--server",
                      workers.url)
    uri, code, _ = run.code()
    approve_device(browser, uri, "alice", code)
    done = run.finish()
    assert done.rc == 0 and "as alice (admin)" in done.stdout, str(done)
