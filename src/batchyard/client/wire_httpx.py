"""`client/wire.py`'s calls through httpx, where the standard library's socket would do less
than httpx does: an https server checked against the system CAs, a proxy in the environment
(`wire.needs_httpx`). httpx's errors become the wire's (`WireError` and below)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from batchyard.client.wire import ConnectFailed, TransportFailed, WireError


class HttpxWire:
    """The same calls through httpx (see the module's doc), its errors as `WireError`s."""

    def __init__(self, base_url: str, *, timeout: float | None, verify: Any,
                 headers: dict[str, str]) -> None:
        from batchyard.client.http import import_httpx

        self.httpx = import_httpx()
        self.http = self.httpx.Client(base_url=base_url, timeout=timeout, verify=verify,
                                      headers=headers)

    def _call(self, call: Any) -> Any:
        httpx = self.httpx
        try:
            return call()
        except httpx.ConnectError as exc:
            raise ConnectFailed(str(exc)) from exc
        except httpx.TransportError as exc:
            raise TransportFailed(str(exc)) from exc
        except httpx.HTTPError as exc:
            raise WireError(str(exc)) from exc

    def request(self, method: str, path: str, *, timeout: Any = "default",
                **kwargs: Any) -> Any:
        if timeout != "default":
            kwargs["timeout"] = self._timeout(timeout)
        return self._call(lambda: self.http.request(method, path, **kwargs))

    def stream(self, method: str, path: str, *, timeout: Any = "default",
               **kwargs: Any) -> Any:
        if timeout != "default":
            kwargs["timeout"] = self._timeout(timeout)
        return _HttpxStream(self, self.http.stream(method, path, **kwargs))

    def _timeout(self, value: Any) -> Any:
        if isinstance(value, tuple):
            return self.httpx.Timeout(value[0], read=value[1])
        return value

    def close(self) -> None:
        self.http.close()


class _HttpxStream:
    def __init__(self, wire: HttpxWire, inner: Any) -> None:
        self.wire, self.inner = wire, inner

    def __enter__(self) -> Any:
        reply = self.wire._call(self.inner.__enter__)
        return _HttpxReply(self.wire, reply)

    def __exit__(self, *exc: Any) -> None:
        self.inner.__exit__(*exc)


class _HttpxReply:
    """An httpx streamed response whose reads raise `WireError`s."""

    def __init__(self, wire: HttpxWire, reply: Any) -> None:
        self.wire, self.reply = wire, reply
        self.status_code, self.headers = reply.status_code, reply.headers

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reply, name)

    def read(self) -> bytes:
        return bytes(self.wire._call(self.reply.read))

    def iter_bytes(self) -> Iterator[bytes]:
        return self._guarded(self.reply.iter_bytes())

    def iter_lines(self) -> Iterator[str]:
        return self._guarded(self.reply.iter_lines())

    def _guarded(self, items: Iterator[Any]) -> Iterator[Any]:
        while True:
            try:
                item = self.wire._call(lambda: next(items))
            except StopIteration:
                return
            yield item


