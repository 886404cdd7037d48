"""The launcher's end of the MPI relay: the rsh agent (node/rsh.py ``local``) holds no
credential, since every rank can read it; it hands ``HOST COMMAND`` to this Unix socket in
the attempt's control dir, and the launcher relays it over the node channel with its own
credential (``POST /relay``, then ``GET /relay/ID`` until the command has ended), answering
with the command's exit code. Only processes that see this attempt's control dir (its own
ranks, in their sandbox or container) reach the socket, and all they can ask for is what
mpirun asks for: a command on one of this job's nodes, in that node's job context."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchyard.node.channel import Channel

WAIT = 20.0
START_DEADLINE = 120.0
POLL_DEADLINE = 600.0


class RelaySocket:
    def __init__(self, path: Path, channel: Channel, say: Callable[[str], None]) -> None:
        self.path = path
        self.channel = channel
        self.say = say
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        folder = os.open(path.parent, os.O_PATH | os.O_CLOEXEC)
        try:  # a socket's path has at most 107 bytes: name it through the folder's fd
            self.sock.bind(f"/proc/self/fd/{folder}/{path.name}")
        finally:
            os.close(folder)
        os.chmod(path, 0o666)  # the job's uid (node/sandbox.py) connects too
        self.sock.listen(64)
        self._closed = False
        threading.Thread(target=self._accept, name="rsh-relay", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                line = b""
                while not line.endswith(b"\n") and len(line) < 1 << 20:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    line += chunk
                request = json.loads(line)
                code = self._relay(str(request["host"]), str(request["command"]))
            except Exception as exc:  # the agent says it, and exits 255 as ssh would
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
                return
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit_code": code}).encode() + b"\n")

    def _relay(self, host: str, command: str) -> int:
        started: dict[str, Any] = self.channel.retrying(
            "POST", "/relay", {"host": host, "command": command},
            deadline=time.time() + START_DEADLINE)
        ident = str(started["id"])
        deadline = time.time() + POLL_DEADLINE
        while True:
            result: dict[str, Any] = self.channel.retrying(
                "GET", f"/relay/{ident}?wait={WAIT:g}", deadline=deadline, timeout=WAIT + 10)
            if result.get("done"):
                return int(result.get("exit_code") or 0)
            deadline = time.time() + POLL_DEADLINE
