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
from batchyard.node import logship
from batchyard.node.channel import Channel
from batchyard.node.logwatch import DirWatch


class LogServer:
    def __init__(self) -> None:
        self.copies: dict[str, bytes] = {}
        self.posts: list[float] = []
        self.lock = threading.Lock()
        self.live: bool | None = None  # what replies say of followers (None: nothing)
        self.refuse: int | None = None  # the status /logs answers with for now (None: takes)
        self.reports: list[tuple[dict[str, Any], dict[str, bytes]]] = []  # and the copies then
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/status"):
                    with owner.lock:
                        owner.reports.append((body["status"], dict(owner.copies)))
                    self._answer(200, {"seq": body["seq"]})
                    return
                if owner.refuse is not None:
                    self._answer(owner.refuse, {"error": {"message": "not now"}})
                    return
                sizes = {}
                with owner.lock:
                    owner.posts.append(time.monotonic())
                    for name, (offset, data) in body["files"].items():
                        have = owner.copies.get(name)
                        if offset == len(have or b"") and (data or have is None):
                            owner.copies[name] = (have or b"") + base64.b64decode(data)
                        sizes[name] = len(owner.copies.get(name, b""))
                self._answer(200, {"sizes": sizes} if owner.live is None else
                             {"sizes": sizes, "live": owner.live})

            def _answer(self, code: int, what: dict[str, Any]) -> None:
                reply = json.dumps(what).encode()
                self.send_response(code)
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
    monkeypatch.setattr(logship, "MAX_CHUNK", 1000)  # several batches for the big one
    monkeypatch.setattr(logship, "MAX_BATCH", 1500)
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


@pytest.mark.parametrize("refusal", [503, 409])
def test_the_final_report_waits_for_every_line(server: LogServer, tmp_path: Path,
                                               refusal: int) -> None:
    """Regression (issue 37; test_server_workers' follower got lines 1-35 of 80 and then
    "succeeded"): while the server could not take a batch (its worker killed: 503 or a
    reset; or a 4xx), the reporter sent the node's final report at once, so the job ended
    with its last lines still on the node, and a follower stopped before they came; a 4xx
    for a batch even counted as "all sent". The final report goes only once the server's
    copy has every byte."""
    logs = tmp_path / "stdouterr"
    logs.mkdir()
    path = logs / "n-rank0.stdout.txt"
    path.write_bytes(b"".join(f"line {i}\n".encode() for i in range(1, 36)))
    chan = _channel(server, tmp_path)
    chan.ship_logs(logs)
    chan.start()
    chan.report({"state": "running"})
    deadline = time.monotonic() + 10
    while server.copies.get(path.name) != path.read_bytes():
        assert time.monotonic() < deadline, "the first lines never arrived"
        time.sleep(0.02)
    server.refuse = refusal
    with open(path, "ab") as fh:
        fh.write(b"".join(f"line {i}\n".encode() for i in range(36, 81)))
    chan.report({"state": "succeeded", "ended_at": time.time()})
    time.sleep(1.0)  # the reporter would have sent it by now
    server.refuse = None
    assert chan.close(time.time() + 30)
    finals = [copies for status, copies in server.reports if status["state"] == "succeeded"]
    assert finals, server.reports
    assert finals[0][path.name] == path.read_bytes()  # every line, before the job ended


def test_an_attempt_gone_ends_the_drain(server: LogServer, tmp_path: Path) -> None:
    """A 404 (the attempt was deleted) is the one refusal the drain does not wait out: the
    final report still goes, at once."""
    logs = tmp_path / "stdouterr"
    logs.mkdir()
    (logs / "n-rank0.stdout.txt").write_bytes(b"unwanted\n")
    server.refuse = 404
    chan = _channel(server, tmp_path)
    chan.ship_logs(logs)
    chan.report({"state": "succeeded", "ended_at": time.time()})
    began = time.monotonic()
    assert chan.close(time.time() + 30)
    assert time.monotonic() - began < 5
    assert [status["state"] for status, _copies in server.reports] == ["succeeded"]


def test_a_batch_that_ends_mid_line_waits_for_the_rest(server: LogServer,
                                                      tmp_path: Path) -> None:
    """Python's print writes a line and its newline in two writes: the newline went in a
    batch of its own, a LIVE_GAP later, and the follower saw the line only then."""
    logs = tmp_path / "stdouterr"
    logs.mkdir()
    path = logs / "n-rank0.stdout.txt"
    path.write_bytes(b"LAT 1 12.5")
    chan = _channel(server, tmp_path)
    chan.ship_logs(logs)
    chan._watch = DirWatch()
    try:
        assert chan._watch.watch(str(logs))
        chan._watch.changed()
        with open(path, "ab") as fh:
            threading.Timer(0.1, lambda: (fh.write(b"\n"), fh.flush())).start()
            assert chan._ship_once(settle=30.0) is True  # (back at the change, not in 30 s)
    finally:
        chan._watch.close()
    assert len(server.posts) == 1 and server.copies[path.name] == b"LAT 1 12.5\n"


def test_logs_nobody_follows_go_once_a_second(server: LogServer, tmp_path: Path) -> None:
    """When the server says nobody follows the job's logs (``live`` false), a chatty rank
    costs it about one call a second; every line still arrives."""
    server.live = False
    logs = tmp_path / "stdouterr"
    logs.mkdir()
    path = logs / "n-rank0.stdout.txt"
    chan = _channel(server, tmp_path)
    chan.ship_logs(logs)
    chan.start()
    began = time.monotonic()
    with open(path, "ab", buffering=0) as fh:
        while time.monotonic() - began < 3.0:
            fh.write(b"line\n")
            time.sleep(0.01)
    assert chan.close(time.time() + 30)
    assert server.copies[path.name] == path.read_bytes()
    assert len(server.posts) <= 6, len(server.posts)  # not one per line (~300)


def test_the_folder_held_is_shipped_whatever_is_put_in_its_place(server: LogServer,
                                                                 tmp_path: Path) -> None:
    """The log folder is held open from ship_logs on (as main's node does) and watched
    through that descriptor: a job that renames it and plants a link to a secret folder in
    its place gets its own lines shipped, as they are written, and never the secret."""
    logs = tmp_path / "stdouterr"
    logs.mkdir()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_bytes(b"secret\n")
    chan = _channel(server, tmp_path)
    chan.ship_logs(logs)
    chan.start()
    moved = tmp_path / "moved"
    logs.rename(moved)
    logs.symlink_to(secret)
    (moved / "n-rank0.stdout.txt").write_bytes(b"mine\n")
    deadline = time.monotonic() + 10
    while "n-rank0.stdout.txt" not in server.copies:
        assert time.monotonic() < deadline, server.copies
        time.sleep(0.02)
    assert chan.close(time.time() + 30)
    assert server.copies == {"n-rank0.stdout.txt": b"mine\n"}
