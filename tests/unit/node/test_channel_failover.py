"""A node channel whose server stops answering finds the next one (issue 33, item 6): the
ticket lists every server of the database, the home's address file of a server on the same
machine says where it came back, and status replies name the servers alive now. Logs sent to
the second carry on from the offset the first had acknowledged, so nothing is sent twice; a
launcher told to stop gives up waiting for a server that is gone and keeps its spool."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from test_channel_logs import LogServer

from batchyard.launchplan import Ticket
from batchyard.node.channel import Channel


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def second() -> LogServer:
    found = LogServer()
    yield found
    found.http.shutdown()


def _logs(tmp_path: Path, text: bytes) -> Path:
    logs = tmp_path / "stdouterr"
    logs.mkdir(exist_ok=True)
    (logs / "n-rank0.stdout.txt").write_bytes(text)
    return logs


def test_logs_go_to_the_next_server_of_the_ticket(second: LogServer, tmp_path: Path) -> None:
    ticket = Ticket(server=_dead_url(), token="t", attempt="a", node_rank=0,
                    node_dir=str(tmp_path), servers=[second.url])
    chan = Channel(ticket)
    chan.ship_logs(_logs(tmp_path, b"one\ntwo\n"))
    assert chan.close(time.time() + 20)
    assert second.copies == {"n-rank0.stdout.txt": b"one\ntwo\n"}
    assert chan.server == second.url


def test_the_home_file_says_where_a_restarted_server_went(second: LogServer,
                                                          tmp_path: Path) -> None:
    home = tmp_path / "server.json"
    home.write_text(json.dumps({"url": second.url, "pid": 1}))
    ticket = Ticket(server=_dead_url(), token="t", attempt="a", node_rank=0,
                    node_dir=str(tmp_path), home_file=str(home))
    chan = Channel(ticket)
    chan.ship_logs(_logs(tmp_path, b"moved\n"))
    assert chan.close(time.time() + 20)
    assert second.copies == {"n-rank0.stdout.txt": b"moved\n"}


def test_a_resend_to_the_new_server_starts_at_the_acknowledged_offset(
        second: LogServer, tmp_path: Path) -> None:
    first = LogServer()
    ticket = Ticket(server=first.url, token="t", attempt="a", node_rank=0,
                    node_dir=str(tmp_path), servers=[second.url])
    chan = Channel(ticket)
    logs = _logs(tmp_path, b"before\n")
    chan.ship_logs(logs)
    assert chan._ship_once() is True
    first.http.shutdown()
    first.http.server_close()  # gone: connections refused from now on
    second.copies["n-rank0.stdout.txt"] = first.copies["n-rank0.stdout.txt"]  # one database
    with open(logs / "n-rank0.stdout.txt", "ab") as fh:
        fh.write(b"after\n")
    assert chan.close(time.time() + 20)
    assert second.copies == {"n-rank0.stdout.txt": b"before\nafter\n"}  # nothing twice


def test_servers_a_reply_names_are_tried_too(second: LogServer, tmp_path: Path) -> None:
    ticket = Ticket(server=_dead_url(), token="t", attempt="a", node_rank=0,
                    node_dir=str(tmp_path))
    chan = Channel(ticket)
    chan.learn([second.url, 7, None])
    assert second.url in chan.servers()
    chan.ship_logs(_logs(tmp_path, b"learnt\n"))
    assert chan.close(time.time() + 20)
    assert second.copies == {"n-rank0.stdout.txt": b"learnt\n"}


def test_a_launcher_told_to_stop_keeps_its_spool_and_ends(tmp_path: Path) -> None:
    ticket = Ticket(server=_dead_url(), token="t", attempt="a", node_rank=0,
                    node_dir=str(tmp_path))
    chan = Channel(ticket)
    logs = _logs(tmp_path, b"unsent\n")
    chan.ship_logs(logs)
    chan.abandon.set()  # SIGTERM
    began = time.monotonic()
    assert not chan.close(time.time() + 24 * 3600)
    assert time.monotonic() - began < 30
    assert (logs / "n-rank0.stdout.txt").read_bytes() == b"unsent\n"
    with pytest.raises(OSError):
        chan.retrying("GET", "/plan", deadline=time.time() + 3600)
