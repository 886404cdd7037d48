"""The node side of log shipping (batchyard.node.channel) against a small stand-in for the
server's /logs route that keeps the same rule: a chunk is appended only at the offset its
copy ends at, and the reply gives every copy's size."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from batchyard.launchplan import Ticket
from batchyard.node import channel as node_channel
from batchyard.node.channel import Channel


class LogServer:
    def __init__(self) -> None:
        self.copies: dict[str, bytes] = {}
        self.posts: list[float] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                sizes = {}
                with owner.lock:
                    owner.posts.append(time.monotonic())
                    for name, (offset, data) in body["files"].items():
                        have = owner.copies.get(name)
                        if offset == len(have or b"") and (data or have is None):
                            owner.copies[name] = (have or b"") + base64.b64decode(data)
                        sizes[name] = len(owner.copies.get(name, b""))
                reply = json.dumps({"sizes": sizes}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[LogServer]:
    found = LogServer()
    yield found
    found.http.shutdown()


def _channel(server: LogServer, tmp_path: Path) -> Channel:
    ticket = Ticket(server=server.url, token="t", attempt="a", node_rank=0,
                    node_dir=str(tmp_path))
    return Channel(ticket)


def test_every_file_arrives_whole_even_an_empty_one(server: LogServer, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_channel, "MAX_CHUNK", 1000)  # several batches for the big one
    monkeypatch.setattr(node_channel, "MAX_BATCH", 1500)
    logs = tmp_path / "stdouterr"
    logs.mkdir()
    (logs / "n-rank0.stdout.txt").write_bytes(bytes(range(256)) * 40)
    (logs / "n-rank0.stderr.txt").write_bytes(b"")
    (logs / ".hidden").write_bytes(b"not a log")
    chan = _channel(server, tmp_path)
    chan.ship_logs(logs)
    began = time.monotonic()
    assert chan.close(time.time() + 30)
    assert time.monotonic() - began < 5  # batch after batch, no backing off in between
    assert server.copies == {"n-rank0.stdout.txt": bytes(range(256)) * 40,
                             "n-rank0.stderr.txt": b""}


def test_a_chatty_rank_is_shipped_every_tick(server: LogServer, tmp_path: Path) -> None:
    """Regression: lines written while a batch was in flight counted as a failed send, so
    the shipper backed off (up to 2 s) exactly when a rank wrote the most."""
    logs = tmp_path / "stdouterr"
    logs.mkdir()
    path = logs / "n-rank0.stdout.txt"
    chan = _channel(server, tmp_path)
    chan.ship_logs(logs)
    chan.start()
    lines = 0
    began = time.monotonic()
    with open(path, "ab", buffering=0) as fh:
        while time.monotonic() - began < 2.0:
            fh.write(f"line {lines}\n".encode())
            lines += 1
            time.sleep(0.002)
    assert chan.close(time.time() + 30)
    assert server.copies[path.name] == path.read_bytes()
    gaps = [b - a for a, b in zip(server.posts, server.posts[1:], strict=False)]
    assert gaps and max(gaps) < 0.5, gaps


def test_log_lag_is_how_long_unshipped_lines_have_waited(server: LogServer,
                                                        tmp_path: Path) -> None:
    """What /metrics reports as a node's log-shipping lag: 0 when everything is shipped,
    the age of what waits while the server cannot take it."""
    logs = tmp_path / "stdouterr"
    logs.mkdir()
    ticket = Ticket(server="http://127.0.0.1:9", token="t", attempt="a", node_rank=0,
                    node_dir=str(tmp_path))  # nothing listens there
    away = Channel(ticket)
    away.ship_logs(logs)
    assert away.log_lag() == 0.0
    (logs / "n-rank0.stdout.txt").write_bytes(b"waiting\n")
    assert away._ship_once() is False
    time.sleep(0.3)
    assert away._ship_once() is False
    assert away.log_lag() >= 0.3
    chan = _channel(server, tmp_path)
    chan.ship_logs(logs)
    assert chan._ship_once() is True and chan.log_lag() == 0.0
