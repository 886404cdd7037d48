"""Keep-alive HTTP for the node channel (batchyard.node.httpconn) against a real HTTP/1.1
server: calls share one connection, and one the server closed while idle is replaced
without the call failing."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from batchyard.node.httpconn import Connections, HttpStatusError


class Server:
    def __init__(self) -> None:
        self.peers: list[Any] = []
        self.idle: float | None = None  # s a connection may stay idle (None: no limit)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner.peers.append(self.client_address)
                code = 404 if self.path == "/missing" else 200
                body = b'{"ok": true}'
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if self.path == "/close":
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.connection.settimeout(owner.idle)  # then handle() closes it

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    found = Server()
    yield found
    found.http.shutdown()


def test_calls_share_a_connection_until_the_server_closes_it(server: Server) -> None:
    conns = Connections(None)
    for _ in range(3):
        assert conns.request("GET", server.url + "/a", None, {}, 10) == \
            ("application/json", b'{"ok": true}')
    assert len(set(server.peers)) == 1
    conns.request("GET", server.url + "/close", None, {}, 10)
    conns.request("GET", server.url + "/a", None, {}, 10)
    assert len(set(server.peers)) == 2
    with pytest.raises(HttpStatusError) as err:
        conns.request("GET", server.url + "/missing", None, {}, 10)
    assert err.value.status == 404
    conns.close()


def test_a_connection_closed_while_idle_is_replaced(server: Server) -> None:
    """The server's keep-alive timeout (a restart alike) closed the connection between two
    calls: the next call goes on a new one instead of failing."""
    conns = Connections(None)
    conns.request("GET", server.url + "/a", None, {}, 10)
    server.idle = 0.2
    conns.request("GET", server.url + "/a", None, {}, 10)
    time.sleep(0.6)  # the server has closed it by now
    assert conns.request("GET", server.url + "/a", None, {}, 10)[1] == b'{"ok": true}'
    assert len(set(server.peers)) == 2


def test_nothing_listening_is_an_oserror() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening
        with pytest.raises(OSError):
            Connections(None).request("GET", f"http://127.0.0.1:{port}/a", None, {}, 2)
