"""The rsh agent mpirun runs for every node (batchyard.node.rsh, written by the launcher's
write_rsh_agent) against a small stand-in for the server's relay routes: what it sends, the
exit code it hands back, retries and refusals; and that the written agent starts with the
standard library only and nothing of the batchyard package (its start-up is on every MPI
job's critical path; bench/mpi_launch.py measures it)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from batchyard.launchplan import Ticket
from batchyard.node.launcher import write_rsh_agent
from batchyard.node.plan import AttemptPaths
from batchyard.node.rsh import _json_str, _parse


class RelayServer:
    """POST .../relay answers an id; GET .../relay/ID answers not-done once, then done."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail_first: list[int] = []  # statuses to answer the first POSTs with
        self.exit_code = 7
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                owner.requests.append({"method": "POST", "path": self.path, "body": body,
                                       "auth": self.headers.get("Authorization")})
                if owner.fail_first:
                    status = owner.fail_first.pop(0)
                    self._answer(status, {"error": {"message": f"no ({status})"}})
                    return
                self._answer(200, {"id": "1-1-abc", "node_rank": 1})

            def do_GET(self) -> None:
                owner.requests.append({"method": "GET", "path": self.path,
                                       "auth": self.headers.get("Authorization")})
                polls = sum(1 for r in owner.requests if r["method"] == "GET")
                self._answer(200, {"done": True, "exit_code": owner.exit_code}
                             if polls > 1 else {"done": False})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def relay_server() -> Iterator[RelayServer]:
    server = RelayServer()
    yield server
    server.http.shutdown()


def _agent(tmp_path: Path, server: str) -> Path:
    ticket = Ticket(server=server, token="node-token-123", attempt="att-uuid", node_rank=0,
                    node_dir=str(tmp_path))
    ticket.save(tmp_path / "ticket.json")  # for the ticket form (batchyard-rsh --ticket)
    # the agent holds no credential: it hands the command to the launcher's relay socket,
    # and the launcher's channel (with the node's credential) relays it to the server
    from batchyard.node.channel import Channel
    from batchyard.node.relaysock import RelaySocket

    relay = RelaySocket(tmp_path / "attempt" / ".batchyard" / "rsh.sock", Channel(ticket),
                        lambda _m: None)
    return write_rsh_agent(AttemptPaths(tmp_path / "attempt"), relay.path)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}


def test_agent_relays_and_exits_as_the_command(tmp_path: Path,
                                               relay_server: RelayServer) -> None:
    agent = _agent(tmp_path, relay_server.url)
    assert "node-token-123" not in agent.read_text()  # ranks can read it: no credential
    command = ["orted", "-mca", "ess", "env", "--hnp-uri", '"12.0;tcp://127.0.0.1:5"',
               "tab\there", "ünï", "\\back"]
    proc = subprocess.run([str(agent), "-x", "local2-1", *command], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 7, proc.stderr
    post, *gets = relay_server.requests
    base = "/api/v1/node/attempts/att-uuid/nodes/0"
    assert post["path"] == base + "/relay"
    assert post["body"] == {"host": "local2-1", "command": " ".join(command)}
    assert post["auth"] == "Bearer node-token-123"
    assert [g["path"] for g in gets] == [base + "/relay/1-1-abc?wait=20"] * 2
    assert all(g["auth"] == "Bearer node-token-123" for g in gets)


def test_agent_retries_server_errors_and_stops_at_a_refusal(tmp_path: Path,
                                                            relay_server: RelayServer) -> None:
    agent = _agent(tmp_path, relay_server.url)
    relay_server.fail_first = [503]
    relay_server.exit_code = 0
    ok = subprocess.run([str(agent), "local2-1", "true"], env=_env(), capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert [r["method"] for r in relay_server.requests][:2] == ["POST", "POST"]
    relay_server.fail_first = [404]
    refused = subprocess.run([str(agent), "nowhere", "true"], env=_env(),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 255
    assert "HTTP 404: no (404)" in refused.stderr


def test_agent_starts_on_the_standard_library_alone(tmp_path: Path,
                                                    relay_server: RelayServer) -> None:
    agent = _agent(tmp_path, relay_server.url)
    first = agent.read_text().splitlines()[0]
    assert first.startswith("#!") and first.endswith(" -IS")  # isolated, no site-packages
    out = tmp_path / "modules.txt"
    # run the agent's own code, then list what it imported
    code = (f"import atexit, sys; atexit.register(lambda: open({str(out)!r}, 'w')"
            ".write('\\n'.join(sorted(sys.modules)))); "
            f"sys.argv = [{str(agent)!r}, 'local2-1', 'true']; "
            f"exec(compile(open({str(agent)!r}).read(), {str(agent)!r}, 'exec'))")
    python = first[2:].rsplit(" ", 1)[0]
    proc = subprocess.run([python, "-IS", "-c", code], env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 7, proc.stderr
    modules = set(out.read_text().split())
    heavy = {"ssl", "socket", "http.client", "urllib.request", "typing", "dataclasses",
             "email", "encodings.idna", "batchyard"}
    assert not {m for m in modules if m in heavy or m.startswith("batchyard.")}


@pytest.mark.parametrize("text", ["", "plain", 'q"uote', "back\\slash", "\t\n\r\x00\x1f\x7f",
                                  "ünïcødé", "😀 emoji", "\udcff lone surrogate"])
def test_json_strings_match_json_dumps(text: str) -> None:
    assert _json_str(text) == json.dumps(text).encode()


def test_http_responses_parse() -> None:
    assert _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") == (200, b"{}")
    chunked = (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3\r\n{\"a\r\n4\r\n\": 1\r\n1\r\n}\r\n0\r\n\r\n")
    assert _parse(chunked) == (201, b'{"a": 1}')
    with pytest.raises(OSError):
        _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
    with pytest.raises(OSError):
        _parse(b"garbage")


def test_agent_with_a_proxy_in_the_environment_goes_through_urllib(
        tmp_path: Path, relay_server: RelayServer) -> None:
    """Where a proxy is configured the node channel's client (which honours it and no_proxy)
    carries the relay, as before."""
    agent = _agent(tmp_path, relay_server.url)
    env = dict(_env(), http_proxy="http://127.0.0.1:9", no_proxy="127.0.0.1")
    proc = subprocess.run([str(agent), "local2-1", "true"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert relay_server.requests[0]["body"] == {"host": "local2-1", "command": "true"}


def test_the_ticket_form_still_works(tmp_path: Path, relay_server: RelayServer) -> None:
    """``python -m batchyard.node.rsh --ticket FILE HOST COMMAND...`` (the agent before it was
    handed its settings) relays the same way."""
    import sys

    _agent(tmp_path, relay_server.url)
    proc = subprocess.run([sys.executable, "-m", "batchyard.node.rsh", "--ticket",
                           str(tmp_path / "ticket.json"), "local2-1", "echo", "hi"],
                          env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert relay_server.requests[0]["body"] == {"host": "local2-1", "command": "echo hi"}
