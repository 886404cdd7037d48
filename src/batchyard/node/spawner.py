"""The rank sandbox's fork server: job processes started in one fork instead of a Python
start-up each.

Every job process the launcher starts on the host goes through node/sandbox.py, run as a
script: a fresh ``python -I -S``, then ``json``, ``ctypes`` and node/pidns.py imported, before
the first ``setns``. That is ~30 ms of a 2-core machine's time, and the MPI relay pays it on the
critical path of every orted it starts. This script (``python -I -S spawner.py LAUNCHER_PID``,
fd 0 a Unix socket to the launcher; standard library only) pays it once, when the sandbox is
made, then serves requests: ``ARGV ENV CWD SPEC`` with the command's stdout and stderr
(``SCM_RIGHTS``). For each it forks twice: the grandchild is what the launcher would have
started (in a session of its own, stdout and stderr those files, stdin ``/dev/null``), and as
the middle process exits at once it is adopted by the launcher, a child subreaper: the
launcher reaps it and gets its exit status as from one it forked itself. Once adopted it sets
its parent-death signal (SIGKILL: the launcher's death kills it) and does exactly what
sandbox.py's ``main`` does: joins the attempt's PID namespace (node/pidns.py: it becomes the
forwarder, its child the job process, which ends as before), enters the mount namespace,
drops to the job's uid or capabilities and ``exec``s the command. The server's answer is the
pid (``PID``) or why it could not (``error MESSAGE``); the launcher then starts the command
the old way. On end-of-file (the launcher closed it, or died) it exits.

This process holds no secret: its environment is the node's process tag and ``PATH`` only
(the tag finds it, and the processes it forks until they ``exec``); the jobs' environments
pass through it. It runs outside the job's namespaces, so no rank sees it in ``/proc``.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import NoReturn

HEADER = 8  # a request: its length (big-endian), then that much JSON; the two fds with it
MAX_REQUEST = 64 << 20


def _siblings():  # type: ignore[no-untyped-def]
    """node/sandbox.py and node/pidns.py, also from this file run as a script."""
    if __package__:
        from batchyard.node import pidns, sandbox

        return sandbox, pidns
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    import pidns  # type: ignore[no-redef]
    import sandbox  # type: ignore[no-redef]

    return sandbox, pidns


def receive(conn: socket.socket) -> tuple[dict[str, object] | None, list[int]]:
    """One request and its fds; (None, []) at end-of-file."""
    import json
    import socket

    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    while len(data) < HEADER or len(data) < HEADER + int.from_bytes(data[:HEADER], "big"):
        if len(data) >= HEADER and int.from_bytes(data[:HEADER], "big") > MAX_REQUEST:
            raise ValueError("request too large")
        more = conn.recv(1 << 20)
        if not more:
            raise ValueError("request cut short")
        data += more
    return json.loads(data[HEADER:]), fds


def serve(conn: socket.socket, launcher: int) -> int:
    import ctypes  # (loaded now: the forks use it)
    import signal

    ctypes.CDLL(None, use_errno=True)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    while True:
        request, fds = receive(conn)  # (a malformed one: this ends, the launcher goes on)
        if request is None:
            return 0
        try:
            answer = f"{start(conn, launcher, request, fds)}\n"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            answer = f"error {exc}\n"
        finally:
            for fd in fds:
                os.close(fd)
        conn.sendall(answer.encode())


def start(conn: socket.socket, launcher: int, request: dict[str, object],
          fds: list[int]) -> int:
    """Fork the job process (by a middle process that exits at once) and return its pid."""
    if len(fds) != 2:
        raise ValueError("stdout and stderr expected")
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:  # pragma: no cover - (a forked child)
        try:
            os.close(read)
            conn.close()
            me = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(write)
                _job_process(launcher, me, request, fds)
            os.write(write, str(pid).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        answer = b""
        while chunk := os.read(read, 64):
            answer += chunk
    finally:
        os.close(read)
        os.waitpid(middle, 0)
    if not answer:
        raise OSError("could not fork")
    return int(answer)


def _job_process(launcher: int, middle: int, request: dict[str, object],
                 fds: list[int]) -> NoReturn:  # pragma: no cover - (a forked child)
    """What the launcher's Popen and sandbox.py's ``main`` did, in this fork."""
    import signal

    code = 126
    try:
        sandbox, pidns = _siblings()
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.closerange(3, 1 << 20)
        argv = [str(a) for a in request["argv"]]  # type: ignore[attr-defined]
        env = {str(k): str(v) for k, v in request["env"].items()}  # type: ignore[attr-defined]
        spec = request["spec"]
        if not isinstance(spec, dict) or not argv:
            raise ValueError("no spec or no command")
        try:
            os.chdir(str(request["cwd"]))
        except OSError as exc:
            raise OSError(f"{request['cwd']}: {exc.strerror}") from None
        while os.getppid() == middle:  # until the launcher (a subreaper) adopts this one
            os.sched_yield()
        pidns._libc().prctl(pidns.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher:
            os._exit(126)  # the launcher is gone (or is no subreaper): nothing to run for
        os.environ.clear()
        os.environ.update(env)
        code = sandbox.run(spec, argv)  # returns only where it failed (and said so)
    except BaseException as exc:
        try:
            os.write(2, f"batchyard sandbox: {exc}\n".encode())
        finally:
            os._exit(code)
    os._exit(code)


class Spawner:
    """The launcher's end: starts the server, asks it for job processes."""

    def __init__(self, tag: str) -> None:
        import socket
        import subprocess
        import threading

        from batchyard.node import proctree

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {"BATCHYARD_PROC_TAG": tag, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
                stdin=theirs.fileno(), stdout=subprocess.DEVNULL, cwd="/", env=env,
                start_new_session=True, preexec_fn=proctree.die_with_parent)
        finally:
            theirs.close()
        self.conn: socket.socket | None = mine
        self.lock = threading.Lock()

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, stdout: int,
              stderr: int, spec: dict[str, object]) -> int:
        """The job process's pid (a child of this process once it runs); OSError where the
        server could not start it (gone, or it said why): start it the old way then."""
        import json
        import socket

        payload = json.dumps({"argv": argv, "env": env, "cwd": cwd, "spec": spec}).encode()
        data = len(payload).to_bytes(HEADER, "big") + payload
        with self.lock:
            conn = self.conn
            if conn is None:
                raise OSError("the sandbox's fork server has ended")
            try:
                conn.settimeout(30.0)
                sent = socket.send_fds(conn, [data], [stdout, stderr])
                conn.sendall(data[sent:])
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = conn.recv(256)
                    if not chunk:
                        raise OSError("the sandbox's fork server has ended")
                    answer += chunk
            except OSError:
                self.close()
                raise
        text = answer.decode(errors="replace").strip()
        if not text.isdigit():
            raise OSError(text.removeprefix("error ").strip() or "no answer")
        return int(text)

    def close(self) -> None:
        """End the server (end-of-file on its socket); whatever it started goes on."""
        import contextlib

        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()


def main(argv: list[str]) -> int:
    import socket

    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: spawner.py LAUNCHER_PID (fd 0: a Unix socket)", file=sys.stderr)
        return 2
    _siblings()
    conn = socket.socket(fileno=0)
    try:
        return serve(conn, int(argv[0]))
    except (BrokenPipeError, ConnectionResetError):
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
