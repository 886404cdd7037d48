"""MPI's rsh agent on the Ray backend: ``mpirun`` on node 0 calls ``ray-rsh-agent HOST CMD``;
the agent hands the request to node 0's Ray actor over an abstract unix socket (no Ray
connection and no Ray token in user processes), and that actor runs the node launcher's own
rsh agent (``batchyard.node.rsh``, i.e. inside the node's job context) on HOST's node through
HOST's actor. The agent stays alive until the remote command ends, as ssh would, and passes
on its output and exit code."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

Runner = Callable[[str, list[str], str], tuple[int, str, str]]


def socket_name(attempt_uuid: str) -> str:
    return f"\0batchyard-rsh-{attempt_uuid}"


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class Relay:
    """Runs in node 0's actor: one thread per rsh request."""

    def __init__(self, attempt_uuid: str, run: Runner) -> None:
        self.run = run
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(socket_name(attempt_uuid))
        self.sock.listen(64)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = json.loads(_read_line(conn))
                code, out, err = self.run(str(request["host"]), list(request["argv"]),
                                          str(request.get("path") or ""))
            except Exception as exc:  # the agent must always get an answer
                code, out, err = 255, "", f"batchyard ray rsh: {type(exc).__name__}: {exc}\n"
            conn.sendall(json.dumps({"code": code, "out": out, "err": err}).encode() + b"\n")

    def close(self) -> None:
        self.sock.close()


def write_agent(path: Path, attempt_uuid: str) -> None:
    """The executable mpirun calls (one file: Open MPI splits the agent setting on spaces)."""
    if path.exists():
        return
    package_root = str(Path(__file__).resolve().parents[2])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable} -S\n"
        "import sys\n"
        f"sys.path.insert(0, {package_root!r})\n"
        "from batchyard.backends.ray_rsh import main\n"
        f"sys.exit(main({attempt_uuid!r}, sys.argv[1:]))\n")
    path.chmod(0o755)


def main(attempt_uuid: str, args: list[str]) -> int:
    while args and args[0].startswith("-"):  # ssh-style options mpirun may add
        args = args[1:]
    if len(args) < 2:
        print("usage: ray-rsh-agent HOST COMMAND...", file=sys.stderr)
        return 2
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(socket_name(attempt_uuid))
        request = {"host": args[0], "argv": args[1:], "path": os.environ.get("PATH", "")}
        conn.sendall(json.dumps(request).encode() + b"\n")
        reply = json.loads(_read_line(conn))
    sys.stdout.write(reply["out"])
    sys.stderr.write(reply["err"])
    return int(reply["code"])
