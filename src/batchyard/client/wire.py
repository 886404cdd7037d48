"""How `Client` (client/http.py) sends its requests: HTTP/1.1 over a socket, with the standard
library only (issue 37: httpx alone cost a CLI call ~10x Python's own start, most of it
imports). It does what the client needs and no more: keep-alive connections from a small
pool (one per request at a time: a followed stream holds its own), Content-Length and
chunked bodies, streams, timeouts, and TLS with the SSL context batchyard trusts for the
server (its CA or a pinned one, `client.http.verify_for`). URLs and queries are encoded as
httpx encodes them.

Where httpx would do more than this, `open_wire` hands the same calls to httpx instead
(`HttpxWire`): an https server checked against the system CAs (httpx's certifi bundle,
SSL_CERT_FILE) and any proxy set in the environment. Both raise the same errors
(`WireError` and below), whose text is the socket's or httpx's."""

from __future__ import annotations

import json as _json
import os
import socket
import threading
import time

from batchyard.client.wire_encoding import json_body, query_string, target  # noqa: F401

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from collections.abc import Iterable, Iterator
    from typing import Any

    from batchyard.client.wire_httpx import HttpxWire

KEEPALIVE = 5.0  # s an idle connection is kept (httpx's keepalive_expiry; uvicorn's is 5 s)
POOL = 10  # idle connections kept
CHUNK = 65536
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy")
NO_BODY = (204, 304)


class WireError(Exception):
    """A request that got no complete answer (httpx.HTTPError's place)."""


class TransportFailed(WireError):
    """The connection failed, broke or timed out (httpx.TransportError's place)."""


class ConnectFailed(TransportFailed):
    """No connection was made: refused, unreachable, unknown host, a TLS handshake that
    failed (httpx.ConnectError's place). The request never reached a server."""


# Replies ----------------------------------------------------------------------------------


class Headers(dict[str, str]):
    """A reply's headers, their names in lower case (``get`` takes any case)."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(str(key).lower())


class Reply:
    """An answer: status, headers, and a body read whole (``content``) or as it comes
    (``iter_bytes``, ``iter_lines`` on a stream). Its connection goes back to the pool once
    the body is read to its end; a body left unread closes it."""

    def __init__(self, status: int, headers: Headers, body: Iterator[bytes] | None = None,
                 conn: _Conn | None = None, wire: Wire | None = None) -> None:
        self.status_code = status
        self.headers = headers
        self._body = body
        self._content: bytes | None = None if body is not None else b""
        self._conn, self._wire = conn, wire

    def read(self) -> bytes:
        if self._content is None:
            self._content = b"".join(self._pieces())
        return self._content

    @property
    def content(self) -> bytes:
        return self.read()

    @property
    def text(self) -> str:
        return self.read().decode(_charset(self.headers.get("content-type", "")), "replace")

    def json(self) -> Any:
        return _json.loads(self.read())

    def iter_bytes(self) -> Iterator[bytes]:
        if self._content is not None:
            if self._content:
                yield self._content
            return
        yield from self._pieces()

    def iter_lines(self) -> Iterator[str]:
        """The body's lines as text, without their line ends (as httpx's)."""
        pending = ""
        charset = _charset(self.headers.get("content-type", ""))
        for piece in self.iter_bytes():
            pending += piece.decode(charset, "replace")
            *lines, pending = pending.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            yield from lines
        if pending:
            yield pending

    def _pieces(self) -> Iterator[bytes]:
        body, self._body = self._body, None
        if body is None:
            raise WireError("the body of this reply was read already")
        complete = False
        try:
            yield from body
            complete = True
        finally:
            self._release(complete)

    def _release(self, complete: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if complete and self._wire is not None:
            self._wire._give(conn)
        else:
            conn.close()

    def close(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            body.close()  # type: ignore[attr-defined]
        self._release(False)


def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"')
    return "utf-8"


# Connections ------------------------------------------------------------------------------


class _Conn:
    def __init__(self, host: str, port: int, context: ssl.SSLContext | None,
                 timeout: float | None) -> None:
        try:
            # an ASCII name as bytes: a str is encoded with the idna codec (imported: ~1 ms)
            name: Any = host.encode() if host.isascii() else host  # (getaddrinfo takes both)
            sock = socket.create_connection((name, port), timeout)
        except TimeoutError as exc:  # httpx: ConnectTimeout, a transport error
            raise TransportFailed(str(exc)) from exc
        except OSError as exc:
            raise ConnectFailed(str(exc)) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=host)
        except TimeoutError as exc:
            sock.close()
            raise TransportFailed(str(exc)) from exc
        except OSError as exc:  # ssl.SSLError is one: a handshake refused or unverified
            sock.close()
            raise ConnectFailed(str(exc)) from exc
        self.sock = sock
        self.file = sock.makefile("rb")
        self.idle_since = time.monotonic()
        self.reusable = True

    def usable(self) -> bool:
        """Still fit for another request: not idle too long, nothing (EOF) waiting on it."""
        if time.monotonic() - self.idle_since > KEEPALIVE:
            return False
        import select

        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        try:
            self.file.close()
        finally:
            self.sock.close()


class Wire:
    """Requests to one server (``base_url``: scheme, host, port and the API's path), each on
    a pooled keep-alive connection. Safe to share between threads."""

    def __init__(self, base_url: str, *, timeout: float | None,
                 context: ssl.SSLContext | None, headers: dict[str, str]) -> None:
        scheme, _, rest = base_url.partition("://")
        netloc, slash, prefix = rest.partition("/")
        self.tls = scheme.lower() == "https"
        if self.tls and context is None:
            raise ValueError("an https wire needs the SSL context to verify with")
        self.context = context if self.tls else None
        host, port = netloc, 443 if self.tls else 80
        if netloc.startswith("["):  # [IPv6]:port
            end = netloc.index("]")
            host = netloc[1:end]
            if netloc[end + 1:].startswith(":"):
                port = int(netloc[end + 2:])
        elif ":" in netloc:
            host, _, number = netloc.rpartition(":")
            port = int(number)
        self.host, self.port = host, port
        self.prefix = "/" + prefix if slash else "/"
        self.timeout = timeout
        default_port = 443 if self.tls else 80
        self.host_header = netloc if port != default_port else (
            f"[{host}]" if ":" in host else host)
        self.headers = {"Host": self.host_header, "Accept": "*/*",
                        "User-Agent": "batchyard", **headers}
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()

    # the pool -----------------------------------------------------------------------------

    def _take(self, connect_timeout: float | None) -> tuple[_Conn, bool]:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.usable():
                    return conn, True
                conn.close()
        return _Conn(self.host, self.port, self.context, connect_timeout), False

    def _give(self, conn: _Conn) -> None:
        if not conn.reusable:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        with self._lock:
            if len(self._idle) < POOL:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # requests -----------------------------------------------------------------------------

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                json: Any = None, content: bytes | Iterable[bytes] | None = None,
                headers: dict[str, str] | None = None, timeout: Any = "default") -> Reply:
        """One request, its answer read whole."""
        reply = self._send(method, path, params, json, content, headers, timeout)
        reply.read()
        return reply

    def stream(self, method: str, path: str, *, params: dict[str, Any] | None = None,
               headers: dict[str, str] | None = None, timeout: Any = "default") -> _Stream:
        """``with wire.stream(...) as reply``: the answer's body read as it comes."""
        return _Stream(lambda: self._send(method, path, params, None, None, headers, timeout))

    def _send(self, method: str, path: str, params: dict[str, Any] | None, json: Any,
              content: bytes | Iterable[bytes] | None, headers: dict[str, str] | None,
              timeout: Any) -> Reply:
        connect_timeout, read_timeout = _timeouts(self.timeout if timeout == "default"
                                                  else timeout)
        pieces: Iterable[bytes] | None = None  # a body sent as it is made (chunked, as httpx)
        if json is not None:
            body = json_body(json)
        elif content is None or isinstance(content, bytes | bytearray | memoryview):
            body = bytes(content or b"")
        else:
            body, pieces = b"", content
        lines = [f"{method} {target(self.prefix, path, params)} HTTP/1.1"]
        merged = dict(self.headers)
        if json is not None:
            merged["Content-Type"] = "application/json"
        if pieces is not None:
            merged["Transfer-Encoding"] = "chunked"
        elif body or method in ("POST", "PUT", "PATCH"):
            merged["Content-Length"] = str(len(body))
        for key, value in (headers or {}).items():
            merged = {k: v for k, v in merged.items() if k.lower() != key.lower()}
            merged[key] = value
        lines += [f"{k}: {v}" for k, v in merged.items()]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        # a pooled connection the server closed meanwhile: once more on a new one, when
        # nothing can have been done (a GET, or a submit under its idempotency key)
        again = pieces is None and (method in ("GET", "HEAD") or any(
            k.lower() == "idempotency-key" for k in (headers or {})))
        while True:
            conn, reused = self._take(connect_timeout)
            try:
                conn.sock.settimeout(read_timeout)
                conn.sock.sendall(data)
                if pieces is not None:
                    _send_chunked(conn, pieces)
                status, reply_headers = _head(conn)
            except _Closed as exc:
                conn.close()
                if reused and again:
                    continue
                raise TransportFailed(str(exc)) from None
            except TimeoutError as exc:
                conn.close()
                raise TransportFailed(str(exc) or "timed out") from exc
            except OSError as exc:
                conn.close()
                if reused and again:
                    continue
                raise TransportFailed(str(exc)) from exc
            except BaseException:
                conn.close()
                raise
            break
        if reply_headers.get("connection", "").lower() == "close":
            conn.reusable = False
        if method == "HEAD" or status in NO_BODY or 100 <= status < 200:
            self._give(conn)
            return Reply(status, reply_headers)
        return Reply(status, reply_headers, _body(conn, reply_headers), conn, self)


def _send_chunked(conn: _Conn, pieces: Iterable[bytes]) -> None:
    for piece in pieces:
        if piece:
            conn.sock.sendall(b"%x\r\n" % len(piece) + bytes(piece) + b"\r\n")
    conn.sock.sendall(b"0\r\n\r\n")


class _Closed(Exception):
    """The server closed the connection without an answer."""


class _Stream:
    def __init__(self, send: Any) -> None:
        self._send = send
        self.reply: Reply | None = None

    def __enter__(self) -> Reply:
        self.reply = self._send()
        return self.reply

    def __exit__(self, *exc: object) -> None:
        if self.reply is not None:
            self.reply.close()


def _timeouts(value: Any) -> tuple[float | None, float | None]:
    if isinstance(value, tuple):
        return value[0], value[1]
    return value, value


def _head(conn: _Conn) -> tuple[int, Headers]:
    line = conn.file.readline(65537)
    if not line:
        raise _Closed("Server disconnected without sending a response.")
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        conn.reusable = False
        raise TransportFailed(f"not an HTTP answer: {line[:80]!r}")
    if parts[0] == "HTTP/1.0":
        conn.reusable = False
    headers = Headers()
    while True:
        raw = conn.file.readline(65537)
        if not raw:
            raise _Closed("Server disconnected without sending a response.")
        if raw in (b"\r\n", b"\n"):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return int(parts[1]), headers


def _body(conn: _Conn, headers: Headers) -> Iterator[bytes]:
    """The body's pieces as they arrive; a connection that ends early raises."""
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size_line = conn.file.readline(65537)
                if not size_line:
                    raise TransportFailed("peer closed connection without sending complete "
                                          "message body (incomplete chunked read)")
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while conn.file.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                piece = conn.file.read(size)
                if piece is None or len(piece) < size or not conn.file.readline(65537):
                    raise TransportFailed("peer closed connection without sending complete "
                                          "message body (incomplete chunked read)")
                yield piece
        length = headers.get("content-length")
        if length is not None:
            left = int(length)
            while left > 0:
                piece = conn.file.read1(min(left, CHUNK))
                if not piece:
                    raise TransportFailed("peer closed connection without sending complete "
                                          f"message body (received {int(length) - left} "
                                          f"bytes, expected {length})")
                left -= len(piece)
                yield piece
            return
        conn.reusable = False  # the body ends when the connection does
        while True:
            piece = conn.file.read1(CHUNK)
            if not piece:
                return
            yield piece
    except TimeoutError as exc:
        conn.reusable = False
        raise TransportFailed(str(exc) or "timed out") from exc
    except (OSError, ValueError) as exc:
        conn.reusable = False
        raise TransportFailed(str(exc)) from exc
    except GeneratorExit:  # closed before the end: the connection cannot be reused
        conn.reusable = False
        raise


def needs_httpx(url: str, verify: Any) -> bool:
    """Whether requests to ``url`` go through httpx: a proxy in the environment (httpx
    honours them), or an https server to be checked against the system CAs."""
    if any(os.environ.get(name) or os.environ.get(name.upper()) for name in PROXY_VARS):
        return True
    return url.lower().startswith("https:") and not _is_context(verify)


def _is_context(verify: Any) -> bool:
    import sys

    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(verify, ssl.SSLContext)


def open_wire(base_url: str, *, timeout: float | None, verify: Any,
              headers: dict[str, str]) -> Wire | HttpxWire:
    """The wire for ``base_url``: `Wire`, else (`needs_httpx`) `HttpxWire`. ``verify``:
    an SSL context, True (system CAs) or, for plain http, anything."""
    if needs_httpx(base_url, verify):
        from batchyard.client.wire_httpx import HttpxWire

        return HttpxWire(base_url, timeout=timeout, verify=verify, headers=headers)
    return Wire(base_url, timeout=timeout, headers=headers,
                context=verify if base_url.lower().startswith("https:") else None)
