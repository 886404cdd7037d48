"""Keep-alive HTTP for the node channel (standard library only, like the launcher).

Each call opened a connection of its own (urllib): a TCP handshake, a TLS one across hosts,
and an accept on the server, for every log batch. Here each thread keeps one connection per
server and sends its calls on it while the server keeps it open. A connection the server
closed while idle (its keep-alive timeout, a restart) is noticed before it is used, and a
call that finds it closed anyway is sent once more on a fresh one: every node-channel call
may be repeated (chunks go at an offset, reports carry a sequence). Where a proxy is set
for the server's address, calls go through urllib as before."""

from __future__ import annotations

import contextlib
import http.client
import select
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

_STALE = (http.client.RemoteDisconnected, ConnectionResetError, ConnectionAbortedError,
          BrokenPipeError)


class HttpStatusError(Exception):
    """An answer of status 400 or more: ``status`` and the body."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class Connections:
    def __init__(self, context: ssl.SSLContext | None) -> None:
        self._ssl = context
        self._local = threading.local()
        self._proxied: dict[str, bool] = {}

    def request(self, method: str, url: str, data: bytes | None, headers: dict[str, str],
                timeout: float) -> tuple[str, bytes]:
        """(content type, body) of a 2xx answer; HttpStatusError for 4xx/5xx; OSError when
        the server cannot be reached or the connection broke."""
        parts = urllib.parse.urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if self._proxy(origin, parts.hostname or ""):
            return _via_urllib(method, url, data, headers, timeout, self._ssl)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        for attempt in (0, 1):
            conn, reused = self._connection(origin, parts, timeout)
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except _STALE:
                self._drop(origin)
                if reused and attempt == 0:
                    continue  # closed by the server while idle: once more, on a new one
                raise
            except http.client.HTTPException as exc:  # a broken answer: as a broken link
                self._drop(origin)
                raise OSError(f"bad answer from {origin}: {exc!r}") from None
            except BaseException:
                self._drop(origin)
                raise
            if resp.will_close:
                self._drop(origin)
            if resp.status >= 400:
                raise HttpStatusError(resp.status, payload)
            return resp.getheader("Content-Type", "") or "", payload
        raise OSError("unreachable")  # (the loop returns or raises)

    def close(self) -> None:
        for origin in list(self._conns()):
            self._drop(origin)

    def _conns(self) -> dict[str, http.client.HTTPConnection]:
        conns: dict[str, http.client.HTTPConnection] | None = getattr(self._local, "conns",
                                                                      None)
        if conns is None:
            conns = self._local.conns = {}
        return conns

    def _connection(self, origin: str, parts: urllib.parse.SplitResult,
                    timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        conns = self._conns()
        conn = conns.get(origin)
        if conn is not None and conn.sock is not None and not _idle_closed(conn.sock):
            conn.sock.settimeout(timeout)
            return conn, True
        self._drop(origin)
        host, port = parts.hostname or "", parts.port
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=timeout,
                                               context=self._ssl or
                                               ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conns[origin] = conn
        return conn, False

    def _drop(self, origin: str) -> None:
        conn = self._conns().pop(origin, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()

    def _proxy(self, origin: str, host: str) -> bool:
        found = self._proxied.get(origin)
        if found is None:
            scheme = origin.split(":", 1)[0]
            proxies = urllib.request.getproxies()
            found = bool(proxies.get(scheme)) and not urllib.request.proxy_bypass(host)
            self._proxied[origin] = found
        return found


def _idle_closed(sock: Any) -> bool:
    """An idle keep-alive connection has nothing to read: if it has, the server closed it
    (or sent what no request asked for), so it is not reused."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _via_urllib(method: str, url: str, data: bytes | None, headers: dict[str, str],
                timeout: float, context: ssl.SSLContext | None) -> tuple[str, bytes]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        raise HttpStatusError(exc.code, exc.read()) from None
