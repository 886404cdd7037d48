"""Starting, finding and stopping the local server that backs the embedded default."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from batchyard import tlstrust
from batchyard.config import (
    ServerInfo,
    ca_file,
    ensure_token,
    home,
    read_server_info,
    server_file,
)
from batchyard.errors import ServerUnavailable

if TYPE_CHECKING:
    from batchyard.server.sso.settings import OidcSettings


def _verify(url: str, ca: str | None) -> ssl.SSLContext | bool:
    if not url.startswith("https:"):
        return True
    context = tlstrust.ssl_context(ca if ca is not None else ca_file(url), url)
    return context if context is not None else True


def healthy(url: str, token: str | None, timeout: float = 2.0,
            ca: str | None = None) -> dict[str, object] | None:
    """The server's health answer, or None when it does not answer as a batchyard server we
    trust (an https URL is verified against ``ca``, default ``config.ca_file``). A broken
    trust setting (missing BATCHYARD_CA file, CA not matching the pin) raises: it must be
    told, not mistaken for a server that is down."""
    try:
        verify = _verify(url, ca)
    except (OSError, ServerUnavailable):  # an unreadable CA file; no server to fetch one from
        return None
    try:
        resp = httpx.get(f"{url}/api/v1/health", timeout=timeout, verify=verify,
                         headers={"Authorization": f"Bearer {token}"} if token else {})
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    data: dict[str, object] = resp.json()
    return data


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return True


def start(host: str = "127.0.0.1", port: int | None = None, timeout: float = 60.0, *,
          tls_cert: str | None = None, tls_key: str | None = None,
          insecure_http: bool = False, force_tls: bool = False,
          workers: int | None = None, oidc: OidcSettings | None = None) -> ServerInfo:
    """Start a detached server (own session, survives this process) and wait until it serves.
    TLS is the server's call (``batchyard.server.main.decide_tls``); we only pass the flags
    and, for its self-made CA, trust the home's ``tls/ca.pem``."""
    ensure_token()
    log_path = home() / "server.log"
    previous = read_server_info()
    old_pid = previous.pid if previous else None
    cmd = [sys.executable, "-m", "batchyard.server", "--host", host]
    if port is not None:
        cmd += ["--port", str(port)]
    if tls_cert:
        cmd += ["--tls-cert", tls_cert]
    if tls_key:
        cmd += ["--tls-key", tls_key]
    if insecure_http:
        cmd.append("--insecure-http")
    if force_tls:
        cmd.append("--tls")
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if oidc is not None:
        cmd += oidc.argv()
    own_ca = None if tls_cert else str(home() / "tls" / "ca.pem")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, cwd=str(home()))
    token = ensure_token()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise ServerUnavailable(f"the local server exited at start (code {proc.returncode})"
                                    f"; log {log_path}:\n{tail}")
        info = read_server_info()
        if (info and info.pid == proc.pid and info.pid != old_pid
                and healthy(info.url, token, ca=own_ca)):
            return info
        time.sleep(0.05)
    proc.terminate()
    raise ServerUnavailable(f"the local server did not answer within {timeout:.0f}s; "
                            f"see {log_path}")


def start_once(running: Callable[[], ServerInfo | None]) -> tuple[ServerInfo, bool]:
    """The on-demand start, one at a time per home: CLI calls made together (a script's
    `&`, a Makefile's -j) would each start a server, and all but one would fail on the
    home's server lock. Under an exclusive lock each caller first asks ``running()`` again:
    the first starts the server, the others find it. True: this call started it."""
    import fcntl

    from batchyard.config import private_file

    with open(private_file(home() / "autostart.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            found = running()
            if found is not None:
                return found, False
            return start(), True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stop(timeout: float = 30.0) -> bool:
    info = read_server_info()
    if info is None or not pid_alive(info.pid):
        return False
    assert info.pid is not None
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(info.pid):
        time.sleep(0.05)
    if pid_alive(info.pid):
        os.kill(info.pid, signal.SIGKILL)
    server_file().unlink(missing_ok=True)
    return True
