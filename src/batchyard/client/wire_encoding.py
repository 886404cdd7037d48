"""URLs, queries and JSON bodies as httpx encodes them, for `client/wire.py` (the server
and its logs see the same requests whichever wire sent them; tests/unit/client/
test_wire_encoding.py checks it against httpx). Unlike httpx, '.'/'..' segments are sent as
they are (the client refuses them first: `client.http.checked_path`) and ``params`` add to a
query the path has instead of replacing it."""

from __future__ import annotations

import json as _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# httpx's path percent-encode set (the WHATWG path set): these stay as they are
PATH_SAFE = UNRESERVED | frozenset(chr(i) for i in range(0x20, 0x7F)
                                   if i not in (0x20, 0x22, 0x23, 0x3C, 0x3E, 0x3F, 0x60,
                                                0x7B, 0x7D))
QUERY_SAFE = UNRESERVED | frozenset(chr(i) for i in range(0x20, 0x7F)
                                    if i not in (0x20, 0x22, 0x23, 0x3C, 0x3E))


def _escaped(text: str, safe: frozenset[str]) -> str:
    """``text`` with every character outside ``safe`` percent-encoded as UTF-8 (httpx's
    ``quote``: both sets hold '%', so an existing escape stays as it is)."""
    if all(c in safe for c in text):
        return text
    return "".join(c if c in safe else "".join(f"%{b:02X}" for b in c.encode("utf-8"))
                   for c in text)


def _plus(text: str) -> str:
    """``urllib.parse.quote_plus`` (what httpx's QueryParams use)."""
    out = []
    for c in text:
        if c in UNRESERVED:
            out.append(c)
        elif c == " ":
            out.append("+")
        else:
            out.append("".join(f"%{b:02X}" for b in c.encode("utf-8")))
    return "".join(out)


def _primitive(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


def query_string(params: dict[str, Any] | None) -> str:
    """``params`` as httpx encodes them (``true``/``false``, a list as repeated keys)."""
    items: list[tuple[str, str]] = []
    for key, value in (params or {}).items():
        for one in value if isinstance(value, list | tuple) else [value]:
            items.append((str(key), _primitive(one)))
    return "&".join(f"{_plus(k)}={_plus(v)}" for k, v in items)


def target(prefix: str, path: str, params: dict[str, Any] | None) -> str:
    """The request target of ``path`` (with a query of its own, if any) under the base URL's
    path ``prefix``, with ``params`` added: what httpx sends for ``base_url`` + ``path``."""
    path = path.split("#", 1)[0]
    path, _, query = path.partition("?")
    full = prefix.rstrip("/") + "/" + _escaped(path, PATH_SAFE).lstrip("/")
    parts = [_escaped(query, QUERY_SAFE)] if query else []
    extra = query_string(params)
    if extra:
        parts.append(extra)
    return full + ("?" + "&".join(parts) if parts else "")


def json_body(value: Any) -> bytes:
    """JSON as httpx encodes a ``json=`` body."""
    return _json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                       allow_nan=False).encode("utf-8")
