"""A real server forced onto HTTPS (`--tls`, as a non-loopback bind would be): clients that
share its home trust its CA, a pin of the CA's sha256 fetches and checks it, plain HTTP and
unverified trust fail, and the one public route (/api/v1/ca.pem) opens nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from batchyard import tlstrust
from batchyard.server.tls import ca_fingerprint
from yardkit import pid_alive, pids_where, wait_until

pytestmark = pytest.mark.timeout(120)
# public on purpose: a client pins the CA, reads the API, asks how to sign in, all before it
# holds a credential; single sign-on's routes are how it gets one (each checks what it is
# given: the device flow's handle, an ID token)
PUBLIC = {"/api/v1/ca.pem", "/api/v1/openapi.json", "/api/v1/docs", "/api/v1/auth/methods",
          "/api/v1/auth/oidc/device", "/api/v1/auth/oidc/device/token",
          "/api/v1/auth/oidc/token"}
# Well-formed bodies for routes that check their credential after reading the body (the
# agent's join carries its join token in the body): refused all the same.
BODIES = {"/api/v1/agent/join": {"join_token": "bogus", "machine_id": "0123456789abcdef",
                                 "hostname": "intruder", "address": "127.0.0.1",
                                 "work_dir": "/tmp/intruder"},
          "/api/v1/agent/nodes/{node}/commands/{command_id}": {"exit_code": 0}}


@dataclass
class TlsServer:
    home: Path
    url: str
    pid: int
    token: str

    @property
    def ca(self) -> Path:
        return self.home / "tls" / "ca.pem"

    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BATCHYARD_", "AZ_BATCHAI_", "AZ_BATCH_", "AZUREML_"))}
    env.update({"BATCHYARD_HOME": str(home), "PYTHONUNBUFFERED": "1"})
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    home = tmp_path_factory.mktemp("tlshome")
    log = open(home / "server.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "batchyard.server", "--host", "127.0.0.1", "--port", "0",
         "--tls"], env=_env(home), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        start_new_session=True, cwd=str(home))
    try:
        def started() -> dict[str, object] | None:
            assert proc.poll() is None, (home / "server.log").read_text()[-3000:]
            with contextlib.suppress(FileNotFoundError, ValueError):
                info: dict[str, object] = json.loads((home / "server.json").read_text())
                if info.get("pid") == proc.pid:
                    return info
            return None

        info = wait_until(started, 60, 0.05, "the TLS server to write server.json")
        srv = TlsServer(home=home, url=str(info["url"]), pid=proc.pid,
                        token=(home / "token").read_text().strip())
        wait_until(lambda: _health(srv), 30, 0.05, "the TLS server to answer")
        yield srv
    finally:
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
        needle = str(home).encode()  # the zygote and anything else of this home, by pid
        for pid in pids_where(lambda blob: needle in blob):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _health(srv: TlsServer) -> bool:
    try:
        resp = httpx.get(srv.url + "/api/v1/health", verify=srv.verify(), timeout=5,
                         headers={"Authorization": f"Bearer {srv.token}"})
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


@pytest.fixture
def client_env(server: TlsServer, monkeypatch: pytest.MonkeyPatch) -> TlsServer:
    """This test process as a client of that server's home (what the CLI and SDK see)."""
    for name in ("BATCHYARD_CA", "BATCHYARD_CA_SHA256", "BATCHYARD_SERVER", "BATCHYARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BATCHYARD_HOME", str(server.home))
    return server


def test_serves_https_with_its_own_ca(server):
    assert server.url.startswith("https://127.0.0.1:")
    assert server.ca.is_file()
    assert (server.home / "tls" / "server.pem").is_file()
    assert _health(server)
    log = (server.home / "server.log").read_text()
    assert ca_fingerprint(server.ca) in log  # so an admin can hand out the pin
    assert server.token not in log
    assert "PRIVATE KEY" not in log


def test_unverified_trust_fails(server):
    with pytest.raises(httpx.ConnectError):  # system CAs do not know this CA
        httpx.get(server.url + "/api/v1/health", timeout=5)


def test_plain_http_to_the_tls_port_fails(server):
    plain = server.url.replace("https://", "http://")
    try:
        resp = httpx.get(plain + "/api/v1/health", timeout=5,
                         headers={"Authorization": f"Bearer {server.token}"})
    except httpx.HTTPError:
        return
    assert resp.status_code != 200, resp.text


def test_local_server_healthy_and_client_trust_the_home_ca(client_env):
    from batchyard.client import local_server
    from batchyard.client.http import Client

    health = local_server.healthy(client_env.url, client_env.token)
    assert health is not None and health["pid"] == client_env.pid
    client = Client(client_env.url, client_env.token)
    try:
        assert client.get("/health")["status"] == "ok"
    finally:
        client.close()


def test_ca_route_is_public_and_only_the_certificate(server):
    resp = httpx.get(server.url + "/api/v1/ca.pem", verify=server.verify(), timeout=5)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/x-pem-file")
    assert resp.text == server.ca.read_text()
    assert "PRIVATE KEY" not in resp.text


def test_every_other_route_still_needs_the_token(server):
    doc = httpx.get(server.url + "/api/v1/openapi.json", verify=server.verify(),
                    timeout=10).json()
    checked = 0
    with httpx.Client(verify=server.verify(), timeout=10) as http:
        for path, methods in doc["paths"].items():
            if path in PUBLIC or not path.startswith("/api/v1/"):
                continue
            for method, op in methods.items():
                if method.upper() not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
                    continue
                concrete = path
                for param in op.get("parameters", []):
                    if param.get("in") == "path":  # a value of the declared type
                        kind = param.get("schema", {}).get("type")
                        value = "0" if kind in ("integer", "number") else "default"
                        concrete = concrete.replace("{" + param["name"] + "}", value)
                resp = http.request(method.upper(), server.url + concrete,
                                    json=BODIES.get(path, {}))
                assert resp.status_code == 401, (method, path, resp.status_code, resp.text)
                checked += 1
    assert checked >= 15


def test_pinned_ca_is_fetched_and_checked(server):
    pin = ca_fingerprint(server.ca)
    pem = tlstrust.fetch_pinned_ca(server.url, pin)
    assert pem.strip() == server.ca.read_text().strip()
    assert tlstrust.fetch_pinned_ca(server.url, pin.upper()).strip() == pem.strip()
    wrong = "0" * 64
    with pytest.raises(tlstrust.PinMismatch) as caught:
        tlstrust.fetch_pinned_ca(server.url, wrong)
    assert pin[:12] in str(caught.value) and wrong[:12] in str(caught.value)


def test_pinned_client_in_another_home(server, tmp_path, monkeypatch):
    """A machine that does not share the home: BATCHYARD_CA_SHA256 alone gets it trusted."""
    from batchyard import config, errors
    from batchyard.client.http import Client

    for name in ("BATCHYARD_CA", "BATCHYARD_SERVER", "BATCHYARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BATCHYARD_HOME", str(tmp_path))
    pin = ca_fingerprint(server.ca)
    monkeypatch.setenv("BATCHYARD_CA_SHA256", pin)
    path = config.ca_file(server.url)
    assert path == str(tmp_path / "tls" / f"pinned-{pin[:16]}.pem")
    assert Path(path).read_text().strip() == server.ca.read_text().strip()
    client = Client(server.url, server.token)
    try:
        assert client.get("/health")["status"] == "ok"
    finally:
        client.close()
    monkeypatch.setenv("BATCHYARD_CA_SHA256", "ab" * 32)
    with pytest.raises(errors.AuthError, match="refusing"):
        config.ca_file(server.url)


def test_urlopen_json(server):
    status, body = tlstrust.urlopen_json("GET", server.url + "/api/v1/health", None,
                                         server.token, str(server.ca), 10)
    assert status == 200 and body["status"] == "ok"
    status, body = tlstrust.urlopen_json("GET", server.url + "/api/v1/health", None, None,
                                         str(server.ca), 10)
    assert status == 401 and body["error"]["code"] == "unauthorized"
    with pytest.raises(urllib.error.URLError):  # not trusted without the CA
        tlstrust.urlopen_json("GET", server.url + "/api/v1/health", None, server.token,
                              None, 10)


def test_server_is_still_alive(server):
    assert pid_alive(server.pid)
