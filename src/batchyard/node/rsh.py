"""The rsh agent mpirun calls instead of ssh: ``agent [OPTIONS] HOST COMMAND...``.

Open MPI (``plm_rsh_agent``) and Hydra, the process manager of MPICH and Intel MPI
(``-launcher rsh -launcher-exec``), call it alike: HOST, then the daemon's command as several
arguments, to be joined and given to a shell (Hydra quotes the proxy's path for that shell:
``"/venv/bin/hydra_pmi_proxy" --control-port HOST:PORT ...``; Intel MPI's
``hydra_bstrap_proxy`` comes unquoted); ssh-style options (``-x``) may come first.
HOST is a node name from the hostfile. The agent asks the server to relay COMMAND (joined and
given to bash, as ssh would) to that node's launcher, which runs it inside the node's job
context (environment, process tag, directories), so teardown there finds everything mpirun
started. It then waits for the command's exit code. No ssh, and no shared disk: the request
and its result cross the node channel like everything else.

mpirun starts one agent per node and the ranks wait for it, so its start-up is on every MPI
job's critical path. ``write_rsh_agent`` (in the launcher) therefore writes a script that
runs ``python -I -S``, imports this file as a top-level module (not ``batchyard.node.rsh``:
the package's ``__init__`` is not needed) and calls ``local``, which holds no credential (a
rank can read the agent): it hands the request to its launcher's relay socket
(node/relaysock.py); ``relay`` (``batchyard-rsh --ticket``) talks to the server itself.
Until the relay request is sent nothing else is imported: plain http is spoken over
``_socket`` (``socket``, ``http.client``, ``urllib``, ``json`` and ``ssl`` each cost a few to
tens of milliseconds to import); https loads ``ssl``. Where the environment names a proxy,
the node channel's own client (``urllib``, which honours it) is used instead, as before.
Standard library only.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: importing typing costs the agent milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Call = Callable[[str, str, "bytes | None", float], Any]

WAIT = 20.0
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy")
_SHORT = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class _Refused(Exception):
    """The server answered 4xx: retrying will not help."""


def main(argv: list[str] | None = None) -> int:
    """``batchyard-rsh --ticket FILE HOST COMMAND...``: the agent from a ticket file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--ticket":
        print("usage: batchyard-rsh --ticket FILE HOST COMMAND...", file=sys.stderr)
        return 2
    from pathlib import Path

    from batchyard.launchplan import Ticket

    ticket = Ticket.load(Path(args[1]))
    return relay(config_of(ticket.server, ticket.token, ticket.attempt, ticket.node_rank,
                           ticket.ca_file), args[2:])


def config_of(server: str, token: str, attempt: str, node_rank: int,
              ca_file: str | None) -> dict[str, Any]:
    """What ``relay`` needs, worked out once (by the launcher, when it writes the agent)."""
    from urllib.parse import urlsplit

    parts = urlsplit(server.rstrip("/"))
    https = parts.scheme == "https"
    return {"server": server.rstrip("/"), "https": https, "host": parts.hostname or "",
            "port": parts.port or (443 if https else 80), "netloc": parts.netloc,
            "base": f"{parts.path}/api/v1/node/attempts/{attempt}/nodes/{node_rank}",
            "token": token, "ca_file": ca_file, "attempt": attempt, "node_rank": node_rank}


def _host_command(args: list[str]) -> tuple[str, str] | None:
    """``[ssh-style options] HOST COMMAND...`` as (host, command); None (and the usage said)
    when either is missing."""
    rest = list(args)
    while rest and rest[0].startswith("-"):  # ssh-style options mpirun may add (e.g. -x)
        rest = rest[1:]
    if len(rest) < 2:
        print("usage: rsh-agent HOST COMMAND...", file=sys.stderr)
        return None
    return rest[0], " ".join(rest[1:])


def relay(config: dict[str, Any], args: list[str]) -> int:
    """Relay ``[ssh-style options] HOST COMMAND...`` and exit as the command did (255 when
    the relay itself failed, as ssh does)."""
    parsed = _host_command(args)
    if parsed is None:
        return 2
    host, command = parsed
    import _signal

    def _terminated(*_: object) -> None:
        raise SystemExit(143)

    _signal.signal(_signal.SIGTERM, _terminated)
    call = _channel_call(config) if _proxied() else _raw_call(config)
    import time

    body = b'{"host": ' + _json_str(host) + b', "command": ' + _json_str(command) + b"}"
    try:
        started = _retrying(call, "POST", "/relay", body, time.time() + 120.0, 30.0)
        ident = str(started["id"])
        while True:
            result = _retrying(call, "GET", f"/relay/{ident}?wait={WAIT:g}", None,
                               time.time() + 600.0, WAIT + 10)
            if result.get("done"):
                return int(result.get("exit_code") or 0)
    except (_Refused, OSError, ValueError, KeyError, TypeError) as exc:
        print(f"batchyard-rsh: {exc}", file=sys.stderr)
        return 255


def local(socket_path: str, args: list[str]) -> int:
    """The agent as the launcher writes it: ``[ssh-style options] HOST COMMAND...`` handed to
    this node's launcher over its relay socket (node/relaysock.py), which relays it with the
    node's credential; no credential here (ranks can read this agent). Exits as the command
    did (255 when the relay itself failed, as ssh does)."""
    parsed = _host_command(args)
    if parsed is None:
        return 2
    import _signal
    import _socket

    def _terminated(*_: object) -> None:
        raise SystemExit(143)

    _signal.signal(_signal.SIGTERM, _terminated)
    body = b'{"host": ' + _json_str(parsed[0]) + b', "command": ' + _json_str(parsed[1]) + b"}\n"
    reply = b""
    try:
        import os

        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        folder, _, name = socket_path.rpartition("/")
        fd = os.open(folder or "/", os.O_PATH | os.O_CLOEXEC)
        try:  # a socket's path has at most 107 bytes: named through the folder's fd
            sock.connect(f"/proc/self/fd/{fd}/{name}")
            sock.sendall(body)
            while not reply.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        finally:
            sock.close()
            os.close(fd)
        import json

        answer = json.loads(reply)
        if "exit_code" not in answer:
            raise ValueError(answer.get("error") or "no answer")
        return int(answer["exit_code"])
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        print(f"batchyard-rsh: relay through {socket_path} failed: {exc}", file=sys.stderr)
        return 255


def _retrying(call: Call, method: str, path: str, body: bytes | None, deadline: float,
              timeout: float) -> dict[str, Any]:
    """Retry while the server is unreachable or failing (5xx), until ``deadline`` (as the
    node channel does)."""
    import time

    delay = 0.2
    while True:
        try:
            result: dict[str, Any] = call(method, path, body, timeout)
            return result
        except _Refused:
            raise
        except (OSError, ValueError):
            if time.time() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _json_str(text: str) -> bytes:
    """``text`` as a JSON string, ASCII only, as ``json.dumps`` writes it (without importing
    json: it loads ``re``)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch in _SHORT:
            out.append(_SHORT[ch])
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    out.append('"')
    return "".join(out).encode("ascii")


def _proxied() -> bool:
    import os

    return any(key.lower() in _PROXY_VARS and value for key, value in os.environ.items())


def _channel_call(config: dict[str, Any]) -> Call:
    """Calls through the node channel's client (urllib: proxies from the environment)."""
    from batchyard.launchplan import Ticket
    from batchyard.node.channel import Channel, ChannelError

    channel = Channel(Ticket(server=config["server"], token=config["token"],
                             attempt=config["attempt"], node_rank=int(config["node_rank"]),
                             node_dir="", ca_file=config.get("ca_file")))

    def call(method: str, path: str, body: bytes | None, timeout: float) -> Any:
        import json

        try:
            return channel.call(method, path, json.loads(body) if body else None,
                                timeout=timeout)
        except ChannelError as exc:
            raise _Refused(str(exc)) from None

    return call


def _raw_call(config: dict[str, Any]) -> Call:
    """One HTTP/1.1 request per connection (``Connection: close``), by hand."""
    host, port = str(config["host"]), int(config["port"])
    base, token = str(config["base"]), str(config["token"])
    head = (f"Host: {config['netloc']}\r\nAuthorization: Bearer {token}\r\n"
            "Accept: application/json\r\nConnection: close\r\n")

    def connect(timeout: float) -> Any:
        if config["https"]:
            import socket
            import ssl

            ca = config.get("ca_file")
            context = ssl.create_default_context(cafile=str(ca)) if ca else \
                ssl.create_default_context()
            raw = socket.create_connection((host, port), timeout)
            return context.wrap_socket(raw, server_hostname=host)
        import _socket

        error: OSError | None = None
        # bytes: a str host is IDNA-encoded first, and that codec imports re and enum (~6 ms)
        name: str | bytes = host.encode() if host.isascii() else host
        for family, kind, proto, _name, addr in _socket.getaddrinfo(
                name, port, 0, _socket.SOCK_STREAM):
            sock = _socket.socket(family, kind, proto)
            sock.settimeout(timeout)
            try:
                sock.connect(addr)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error or OSError(f"cannot resolve {host}")

    def call(method: str, path: str, body: bytes | None, timeout: float) -> Any:
        request = f"{method} {base}{path} HTTP/1.1\r\n{head}"
        if body is not None:
            request += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        data = request.encode() + b"\r\n" + (body or b"")
        sock = connect(timeout)
        try:
            sock.sendall(data)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        finally:
            sock.close()
        status, payload = _parse(b"".join(chunks))
        import json

        if status >= 400:
            import contextlib

            text = payload.decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                text = json.loads(text)["error"]["message"]
            if status >= 500 or status == 429:
                raise OSError(f"server error {status}: {text}")
            raise _Refused(f"HTTP {status}: {text}")
        return json.loads(payload or b"null")

    return call


def _parse(response: bytes) -> tuple[int, bytes]:
    """Status and body of a whole HTTP/1.1 response (Content-Length or chunked)."""
    head, sep, body = response.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if not sep or not lines[0].startswith(b"HTTP/"):
        raise OSError("malformed HTTP response from the server")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(b":")
        headers[key.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        out, rest = [], body
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                break
            out.append(rest[:size])
            rest = rest[size + 2:]
        body = b"".join(out)
    elif b"content-length" in headers:
        length = int(headers[b"content-length"])
        if len(body) < length:
            raise OSError("the server's response was cut short")
        body = body[:length]
    return status, body


if __name__ == "__main__":
    sys.exit(main())
