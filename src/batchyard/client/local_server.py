"""Starting, finding and stopping the local server that backs the embedded default."""

from __future__ import annotations

import os
import sys
import time

from batchyard.config import (
    ServerInfo,
    ca_file,
    ensure_token,
    home,
    private_file,
    read_server_info,
    server_file,
)
from batchyard.errors import ServerUnavailable

STARTING = "server.starting"  # the pid of a server being started (by `server start`)

TYPE_CHECKING = False  # (httpx, ssl, subprocess: loaded where used; the CLI's start-up)
if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

    from batchyard.server.sso.settings import OidcSettings


def _verify(url: str, ca: str | None) -> ssl.SSLContext | bool:
    from batchyard import tlstrust

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
    from batchyard.client.http import import_httpx

    httpx = import_httpx()
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


def server_expected() -> bool:
    """Whether the home says a server should be answering soon: a server process holds
    this home (its lock: starting or restarting) or is named by the home's address file and
    alive. A client then waits for it instead of giving up (or starting another)."""
    if os.environ.get("BATCHYARD_SERVER"):
        return False  # a server elsewhere: this home says nothing about it
    info = read_server_info()
    if info is not None and _server_process(info.pid):
        return True
    # the server holding the home's lock (it writes its pid there once it has it), or one
    # `server start` launched that has not got that far yet (its imports take seconds on a
    # loaded machine)
    for name in ("server.lock", STARTING):
        try:
            if _server_process(int((home() / name).read_text().strip() or 0)):
                return True
        except (OSError, ValueError):
            continue
    return False


def _server_process(pid: int | None) -> bool:
    """A live batchyard server process (not another process that got a stale file's pid
    after a reboot: a client would wait for nothing)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"batchyard" in fh.read()
    except OSError:
        return True  # (no /proc here: the pid is all there is to go by)


def start(host: str = "127.0.0.1", port: int | None = None, timeout: float = 60.0, *,
          tls_cert: str | None = None, tls_key: str | None = None,
          insecure_http: bool = False, force_tls: bool = False,
          workers: int | None = None, oidc: OidcSettings | None = None) -> ServerInfo:
    """Start a detached server (own session, survives this process) and wait until it serves.
    TLS is the server's call (``batchyard.server.main.decide_tls``); we only pass the flags
    and, for its self-made CA, trust the home's ``tls/ca.pem``."""
    import contextlib
    import subprocess
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
    with contextlib.suppress(OSError):  # clients wait for it meanwhile (server_expected)
        private_file(home() / STARTING).write_text(str(proc.pid))
    token = ensure_token()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if proc.returncode == 1 and _another_took_over(token, deadline):
                info = read_server_info()  # a server (re)started by someone else meanwhile
                assert info is not None
                return info
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


def _another_took_over(token: str, deadline: float) -> bool:
    """Our server found the home's lock taken: a `server start` (a restart) got there first.
    Its answer is as good as ours: wait for it rather than fail."""
    while time.monotonic() < deadline and server_expected():
        info = read_server_info()
        if info is not None and pid_alive(info.pid) and healthy(info.url, token):
            return True
        time.sleep(0.1)
    return False


def start_once(running: Callable[[], ServerInfo | None]) -> tuple[ServerInfo, bool]:
    """The on-demand start, one at a time per home: CLI calls made together (a script's
    `&`, a Makefile's -j) would each start a server, and all but one would fail on the
    home's server lock. Under an exclusive lock each caller first asks ``running()`` again:
    the first starts the server, the others find it. True: this call started it."""
    import fcntl

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
    import signal

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
