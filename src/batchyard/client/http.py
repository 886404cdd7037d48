"""One small HTTP client for everything that talks to the server. It finds the server
(BATCHYARD_SERVER/BATCHYARD_TOKEN, else $BATCHYARD_HOME/server.json and token) and, when
none answers and none was configured, starts a local one in the background and says so once.
An https server is verified against ``config.ca_file`` (BATCHYARD_CA, the home's CA, a pinned
CA) or the system CAs."""

from __future__ import annotations

import os
import sys

from batchyard import errors
from batchyard.client import local_server
from batchyard.client.wire import (
    ConnectFailed,
    TransportFailed,
    WireError,
    needs_httpx,
    open_wire,
)
from batchyard.config import (
    ca_file,
    home,
    home_token,
    read_server_info,
    read_token,
)

TYPE_CHECKING = False  # (typing, ssl and httpx load where used: the CLI's start-up)
if TYPE_CHECKING:
    import ssl
    import types
    from collections.abc import Iterator
    from typing import Any

    from batchyard.client.wire import Reply, Wire
    from batchyard.client.wire_httpx import HttpxWire


def import_httpx() -> types.ModuleType:
    """``import httpx``, without its command line. httpx's ``__init__`` imports
    ``httpx._main`` (click, pygments, rich progress bars and syntax highlighting: ~15 ms)
    whenever those happen to be installed, only to re-export ``main``. While httpx itself
    loads, a stand-in takes that module's place; afterwards it is gone from ``sys.modules``,
    so ``httpx.main()`` and any later ``import httpx._main`` get the real one."""
    import types

    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        import httpx

        return httpx
    stub = types.ModuleType("httpx._main")

    def main(*args: Any, **kwargs: Any) -> Any:
        from httpx._main import main as real_main

        return real_main(*args, **kwargs)

    stub.main = main  # type: ignore[attr-defined]
    sys.modules["httpx._main"] = stub
    try:
        import httpx
    finally:
        if sys.modules.get("httpx._main") is stub:
            del sys.modules["httpx._main"]
    return httpx


def __getattr__(name: str) -> Any:
    if name == "httpx":  # (was imported here; loaded now only by those who ask)
        return import_httpx()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


API = "/api/v1"
NEXT_CURSOR = "X-Next-Cursor"  # paged listings: where the next page starts
# How long a refused connection is tried again: briefly when nothing says a server should be
# there (say so quickly), longer when the home says one is expected (a restart takes seconds;
# 96 of 100 clients submitting during a 3.4 s restart gave up at 3 s).
REFUSED_BRIEF = 3.0
REFUSED_EXPECTED = 10.0
REFUSED_CAP = 120.0


def refused(exc: BaseException) -> bool:
    """A connection the server's host refused (nothing listens): the request never reached
    a server, so sending it again is safe whatever it was."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError) or "connection refused" in str(
                current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


class RefusedWait:
    """How long refused connections are tried again: ``REFUSED_BRIEF`` seconds for a
    server told explicitly (say quickly that it is not there); for one the home named,
    ``REFUSED_EXPECTED`` seconds since the home last said a server is expected (a server
    process holds it: starting or restarting, however slowly on a loaded machine), at most
    ``REFUSED_CAP`` in all."""

    def __init__(self, from_home: bool) -> None:
        import time

        self.start = self.seen = time.monotonic()
        self.from_home = from_home

    def again(self, delay: float) -> bool:
        """Whether to try again after sleeping ``delay``."""
        import time

        now = time.monotonic()
        if local_server.server_expected():
            self.seen = now
            patience = REFUSED_EXPECTED
        else:
            patience = REFUSED_EXPECTED if self.from_home else REFUSED_BRIEF
        return now + delay - self.seen <= patience and now - self.start < REFUSED_CAP


def checked_path(path: str) -> str:
    """A path built from names the user typed: a '.' or '..' segment (a name such as '../..')
    would be resolved away by httpx into another route before the server could name it."""
    parts = path.split("?", 1)[0].split("/")
    for i, part in enumerate(parts):
        if part in (".", "..") or "\0" in part:
            end = i
            while end + 1 < len(parts) and parts[end + 1] in (".", ".."):
                end += 1
            name = "/".join(parts[i:end + 1])
            raise errors.SpecError(f"{name!r} is not a name: names may not contain '/' or "
                                   "be '.' or '..'")
    return path


def verify_for(url: str) -> ssl.SSLContext | bool:
    """What httpx should verify ``url`` against: the CA batchyard trusts for it, else the
    system CAs (True). Plain http needs no CA: it gets a context that trusts none (cheap;
    httpx's default loads certifi's bundle, ~10-20 ms a client), so anything that did turn
    into TLS fails verification instead of passing unchecked."""
    import ssl

    from batchyard import tlstrust

    if not url.startswith("https:"):
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context = tlstrust.ssl_context(ca_file(url), url)
    return context if context is not None else True


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 60.0, *,
                 from_home: bool = False) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # the address came from the home's server.json: a server restarted on another port
        # writes its new one there, and this client follows it
        self.from_home = from_home
        self._http = self._make_http()

    def _make_http(self) -> Wire | HttpxWire:
        """The requests' way to the server (client/wire.py): the standard library's
        sockets, or httpx where a proxy or the system CAs are involved. Plain http needs
        no SSL context (nor ssl)."""
        https = self.url.startswith("https:")
        verify = verify_for(self.url) if https or needs_httpx(self.url, True) else None
        return open_wire(
            self.url + API, timeout=self.timeout, verify=verify,
            headers={"Authorization": f"Bearer {self.token}"} if self.token else {},
        )

    def follow_home(self) -> None:
        """Take the home's current server address (and token) if it moved."""
        if not self.from_home:
            return
        info = read_server_info()
        if info is None or info.url.rstrip("/") == self.url:
            return
        self._http.close()
        self.url, self.token = info.url.rstrip("/"), read_token() or self.token
        self._http = self._make_http()

    def send(self, method: str, path: str, **kwargs: Any) -> Reply:
        """One request. A refused connection is tried again (with backoff, following the
        home's address) as ``RefusedWait`` says: it never reached a server."""
        import time

        wait = RefusedWait(self.from_home)
        delay = 0.1
        while True:
            try:
                return self._http.request(method, checked_path(path), **kwargs)
            except ConnectFailed as exc:
                if not refused(exc) or not wait.again(delay):
                    raise errors.ServerUnavailable(
                        f"cannot reach the batchyard server at {self.url}: {exc}") from None
            except WireError as exc:
                raise errors.ServerUnavailable(
                    f"cannot reach the batchyard server at {self.url}: {exc}") from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            self.follow_home()

    @classmethod
    def connect(cls, *, autostart: bool = True, quiet: bool = False) -> Client:
        """A client of the running server (one HTTP client per process: the health check is
        its own first request, not another client's).

        Which server: BATCHYARD_SERVER, else the one the last `batchyard login` chose, else
        the local one (started on demand). Which token: BATCHYARD_TOKEN, else the login
        stored for that server, else the home's own."""
        from batchyard.client import credentials

        configured = os.environ.get("BATCHYARD_SERVER")
        given = os.environ.get("BATCHYARD_TOKEN", "").strip() or None
        login = None if configured else credentials.current()
        if configured or login:
            url = configured.rstrip("/") if configured else login[0]  # type: ignore[index]
            token = given or credentials.token_for(url) or home_token()
            found = cls._if_healthy(url, token, strict=bool(given or login or
                                                            credentials.token_for(url)))
            if found is not None:
                return found
            why = ("BATCHYARD_SERVER is set" if configured else
                   "you logged in to it; `batchyard logout` goes back to the local server")
            raise errors.ServerUnavailable(
                f"the batchyard server at {url} does not answer ({why}, so no local server is "
                "started)")
        info = read_server_info()
        token = read_token()
        if info is not None:
            found = cls._if_healthy(info.url, token, from_home=True, strict=given is not None)
            if found is not None:
                return found
        if local_server.server_expected():
            found = cls._await_expected()  # starting or restarting: wait, never start another
            if found is not None:
                return found
        if not autostart:
            raise errors.ServerUnavailable("no batchyard server is running; "
                                           "start one with `batchyard server start`")

        def running() -> Any:  # asked again under the start lock: another call may have won
            now = read_server_info()
            found = cls._if_healthy(now.url, read_token()) if now is not None else None
            if found is None:
                return None
            found.close()
            return now

        info, started = local_server.start_once(running)
        if started and not quiet:
            log = home() / "server.log"
            print(f"Started a local batchyard server at {info.url} (log: {log})",
                  file=sys.stderr)
        return cls(info.url, read_token(), from_home=True)

    @classmethod
    def _await_expected(cls) -> Client | None:
        """The home's server, once it answers (read again each try: a restart may move it
        to another port); None once the home no longer says one is expected, or after
        REFUSED_CAP seconds."""
        import time

        deadline = time.monotonic() + REFUSED_CAP
        while time.monotonic() < deadline:
            info = read_server_info()
            if info is not None:
                found = cls._if_healthy(info.url, read_token(), from_home=True)
                if found is not None:
                    return found
            if not local_server.server_expected():
                return None
            time.sleep(0.2)
        return None

    @classmethod
    def _if_healthy(cls, url: str, token: str | None, timeout: float = 2.0, *,
                    from_home: bool = False, strict: bool = False) -> Client | None:
        """A client of ``url`` when it answers as a batchyard server we trust, else None:
        ``local_server.healthy`` done with the client itself. ``strict``: a token the user
        chose (BATCHYARD_TOKEN, a login) that the server refuses is said as the server says
        it (expired, revoked, a disabled user), not taken for a server that is away."""
        try:
            client = cls(url, token, from_home=from_home)
        except (OSError, errors.ServerUnavailable):  # unreadable CA file; no server to ask
            return None
        try:
            resp = client._http.request("GET", "/health", timeout=timeout)
        except WireError:
            resp = None
        if resp is None or resp.status_code != 200:
            client.close()
            if strict and resp is not None and resp.status_code in (401, 403, 429):
                cls._result(resp)  # raises the server's error
            return None
        return client

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._result(self.send(method, path, **kwargs))

    @staticmethod
    def _result(resp: Reply) -> Any:
        if resp.status_code == 204:
            return None
        if resp.status_code >= 400:
            try:
                body = resp.json().get("error") or {}
            except ValueError:
                body = {"message": resp.text[:500] or f"HTTP {resp.status_code}"}
            raise errors.from_dict(body, resp.status_code)
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.content

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items()
                                                  if v is not None})

    def page(self, path: str, **params: Any) -> tuple[list[Any], str | None]:
        """One page of a paged listing (``limit``, ``cursor``) and the next page's cursor
        (the X-Next-Cursor header; None on the last page)."""
        query = {k: v for k, v in params.items() if v is not None}
        rows = self._result(resp := self.send("GET", path, params=query))
        return list(rows or []), resp.headers.get(NEXT_CURSOR) or None

    def pages(self, path: str, limit: int = 100, **params: Any) -> Iterator[list[Any]]:
        """Every page of a paged listing, ``limit`` rows each, as they come."""
        cursor: str | None = None
        while True:
            rows, cursor = self.page(path, limit=limit, cursor=cursor, **params)
            yield rows
            if not cursor:
                return

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json=body, **kwargs)

    def submit(self, path: str, body: Any, *, deadline: float = 30.0) -> Any:
        """POST a submit under one idempotency key, sent again with the same key while the
        answer is lost (a dropped connection, a timeout) or the server sheds load (502-504):
        the job is made once however many tries reach the server. A refused connection is
        retried as ``RefusedWait`` says (that try certainly made nothing): briefly when no
        server is expected, which should be said quickly; longer when the home says one is
        (a restart)."""
        import time

        # 128 random bits in hex, as uuid4().hex (uuid imports platform: issue 37's start-up)
        headers = {"Idempotency-Key": os.urandom(16).hex()}
        start = time.monotonic()
        refusals = RefusedWait(self.from_home)
        delay = 0.2
        while True:
            waited = time.monotonic() - start
            try:
                resp = self._http.request("POST", checked_path(path), json=body,
                                          headers=headers)
            except ConnectFailed as exc:
                again = refusals.again(delay) if refused(exc) else \
                    waited + delay <= min(deadline, 5.0)
                if not again:
                    raise errors.ServerUnavailable(
                        f"cannot reach the batchyard server at {self.url}: {exc}") from None
                self.follow_home()
            except TransportFailed as exc:
                if waited + delay > deadline:
                    raise errors.ServerUnavailable(
                        f"no answer from the batchyard server at {self.url}: {exc}") from None
            else:
                if resp.status_code not in (502, 503, 504) or waited + delay > deadline:
                    return self._result(resp)
                after = resp.headers.get("Retry-After", "")
                delay = max(delay, float(after)) if after.isdigit() else delay
            time.sleep(delay)
            delay = min(delay * 2, 4.0)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def delete_with(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, params={k: v for k, v in params.items()
                                                     if v is not None})

    def stream(self, path: str, **params: Any) -> Iterator[bytes]:
        query = {k: v for k, v in params.items() if v is not None}
        try:
            with self._http.stream("GET", checked_path(path), params=query,
                                   timeout=None) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._result(resp)
                yield from resp.iter_bytes()
        except WireError as exc:
            raise errors.ServerUnavailable(f"log stream from {self.url} broke: {exc}") from None

    def download(self, url_path: str, dest: str, **params: Any) -> int:
        query = {k: v for k, v in params.items() if v is not None}
        size = 0
        with self._http.stream("GET", checked_path(url_path), params=query) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._result(resp)
            with open(dest, "wb") as fh:
                for chunk in resp.iter_bytes():
                    fh.write(chunk)
                    size += len(chunk)
        return size

    def upload_snapshot(self, data: bytes) -> str:
        result = self.request("POST", "/snapshots", content=data,
                              headers={"content-type": "application/gzip"})
        return str(result["id"])

    # paths -------------------------------------------------------------------------------

    @staticmethod
    def job_path(ws: str, exp: str, name: str) -> str:
        return f"/workspaces/{ws}/experiments/{exp}/jobs/{name}"
