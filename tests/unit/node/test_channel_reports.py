"""A launcher's report goes to the server at once when it says something new (a state, its
ranks, an exec's result); a usage sample alone (every ~2 s) waits for the next heartbeat,
and goes with it: with quiet jobs running, a POST per node every 2 s was most of the
server's CPU (issue 37, item 2)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from batchyard.launchplan import Ticket, report_news
from batchyard.node.channel import Channel


class StatusServer:
    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.reports.append(body["status"])
                reply = json.dumps({"seq": body["seq"], "version": 0, "control": {}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[StatusServer]:
    found = StatusServer()
    yield found
    found.http.shutdown()


def _wait(check: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_a_sample_alone_waits_and_news_goes_at_once(server: StatusServer,
                                                    tmp_path: Path) -> None:
    chan = Channel(Ticket(server=server.url, token="t", attempt="a", node_rank=0,
                          node_dir=str(tmp_path)))
    threading.Thread(target=chan._reporter, daemon=True).start()
    try:
        running = {"state": "running", "ranks": [{"rank": 0, "pid": 7}], "updated_at": 1.0}
        chan.report(running)
        assert _wait(lambda: len(server.reports) == 1, 3.0)
        chan.report({**running, "util": {"cpu_percent": 3.0}, "updated_at": 2.0})
        chan.report({**running, "util": {"cpu_percent": 4.0}, "updated_at": 4.0})
        time.sleep(1.0)  # the heartbeat is 5 s away
        assert len(server.reports) == 1
        chan.report({**running, "util": {"cpu_percent": 4.0}, "updated_at": 5.0,
                     "state": "succeeded"})
        assert _wait(lambda: len(server.reports) == 2, 3.0)
        assert server.reports[1]["util"] == {"cpu_percent": 4.0}  # the samples came along
    finally:
        chan._stop.set()
        chan._report_wake.set()


def test_what_is_news() -> None:
    before = {"state": "running", "util": {"cpu_percent": 1.0}, "gpu": {}, "scrape": {},
              "updated_at": 1.0, "execs": {}}
    assert report_news(None, before)
    assert not report_news(before, {**before, "util": {"cpu_percent": 9.0}, "updated_at": 3.0,
                                    "gpu": {"mean": 4}, "scrape": {"lag": 0.1}})
    assert report_news(before, {**before, "execs": {"x": {"rc": 0}}})
    assert report_news(before, {**before, "idle": True})
