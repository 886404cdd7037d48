"""The launcher's end of the MPI relay: the rsh agent (node/rsh.py ``local``) holds no
credential, since every rank can read it; it hands ``HOST COMMAND`` to this Unix socket in
the attempt's control dir, and the launcher relays it over the node channel with its own
credential (``POST /relay``, then ``GET /relay/ID`` until the command has ended), answering
with the command's exit code. Only processes that see this attempt's control dir (its own
ranks, in their sandbox or container) reach the socket, and all they can ask for is what
mpirun asks for: a command on one of this job's nodes, in that node's job context.

Where the target node's launcher runs on this machine (virtual nodes of one machine: the
local backend), the request skips the server: each launcher of an MPI attempt listens on an
*exec socket* (:class:`ExecSocket`) in its user's private folder for the attempt's PID
namespaces (node/pidns.py: 0700, hidden in every sandbox), and the relay hands the command
straight to it and gets the exit code back when the command ends. No socket there (another
machine, a launcher not up yet or gone): the server relays it as before. Only a process of
the launcher's own uid outside any sandbox reaches that folder (and the socket checks the
uid), and such a process could read the node's credential and ask the server for the same
anyway."""

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


def _read_line(conn: socket.socket, limit: int = 1 << 20) -> bytes | None:
    """One newline-ended message (at most ``limit`` bytes read); None when the peer closed
    before its end."""
    line = b""
    while not line.endswith(b"\n") and len(line) < limit:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        line += chunk
    return line


def _serve_forever(sock: socket.socket, closed: Callable[[], bool],
                   serve: Callable[[socket.socket], None]) -> None:
    """Accept until the socket is closed: each connection served on a thread of its own."""
    while not closed():
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def exec_socket_path(attempt_uuid: str, node_rank: int) -> str:
    """Where the launcher of node ``node_rank`` of the attempt listens on this machine."""
    from batchyard.node.pidns import socket_path

    return f"{socket_path(attempt_uuid)}.exec-{node_rank}"


class RelaySocket:
    def __init__(self, path: Path, channel: Channel, say: Callable[[str], None],
                 peer: Callable[[str], str | None] = lambda _host: None) -> None:
        """``peer``: the exec socket of the launcher of HOST, were it on this machine."""
        self.path = path
        self.channel = channel
        self.say = say
        self.peer = peer
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
        _serve_forever(self.sock, lambda: self._closed, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                line = _read_line(conn)
                if line is None:
                    return
                request = json.loads(line)
                code = self._relay(str(request["host"]), str(request["command"]))
            except Exception as exc:  # the agent says it, and exits 255 as ssh would
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
                return
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit_code": code}).encode() + b"\n")

    def _relay(self, host: str, command: str) -> int:
        peer = self.peer(host)
        code = None if peer is None else _local_relay(peer, command)
        if code is not None:
            return code
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


def _local_relay(path: str, command: str) -> int | None:
    """``command`` run by the launcher listening at ``path`` (on this machine): its exit code
    (255 when that launcher ended first); None when none listens there."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            conn.connect(path)
        except OSError:
            return None  # (not on this machine, not up yet, or gone: the server relays it)
        conn.sendall(json.dumps({"command": command}).encode() + b"\n")
        reply = None
        with contextlib.suppress(OSError):
            reply = _read_line(conn)
    finally:
        conn.close()
    try:
        return int(json.loads(reply or b"")["exit_code"])
    except (ValueError, KeyError, TypeError):
        return 255  # the launcher there ended before the command did


class ExecSocket:
    """A launcher's end of the relay's shortcut on one machine: ``{"command": ...}`` from
    another launcher of the attempt here (``submit`` queues it for the launcher's main loop
    and returns its id), answered ``{"exit_code": N}`` once :meth:`done` says it ended. On
    :meth:`close` the connections still waiting are closed unanswered (255 at their end, as
    the server says for a launcher that has ended)."""

    def __init__(self, path: str, submit: Callable[[str], str],
                 say: Callable[[str], None]) -> None:
        self.path, self.submit, self.say = path, submit, say
        self._codes: dict[str, int] = {}
        self._cond = threading.Condition()
        self._closed = False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(64)
        threading.Thread(target=self._accept, name="relay-exec", daemon=True).start()

    def done(self, ident: str, code: int) -> None:
        with self._cond:
            self._codes[ident] = code
            self._cond.notify_all()

    def close(self) -> None:
        """No longer listening first, then the waiting connections told: a launcher that
        hears 255 from here and tries again finds none listening (the server relays it),
        not a socket about to close."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self.sock.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _accept(self) -> None:
        _serve_forever(self.sock, lambda: self._closed, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        import struct

        with conn:
            try:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                        struct.calcsize("3i"))
                if struct.unpack("3i", creds)[1] != os.geteuid():
                    return  # (the folder is this user's own: never another's)
                line = _read_line(conn)
                if line is None:
                    return
                ident = self.submit(str(json.loads(line)["command"]))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.say(f"relay exec from this machine refused: {exc}")
                return
            with self._cond:
                while ident not in self._codes and not self._closed:
                    self._cond.wait()
                code = self._codes.pop(ident, None)
            if code is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"exit_code": code}).encode() + b"\n")
