"""`batchyard job exec` (and `cluster node exec -it`): a command, or an interactive shell
with a real terminal, in a job's node context, over a WebSocket (as `kubectl exec -it`).
WebSockets are imported only when a session starts (every other command's start-up)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import typer

from batchyard import errors
from batchyard.cli.common import (
    EXIT_INTERRUPTED,
    ExperimentOpt,
    WorkspaceOpt,
    client,
    fail,
    handled,
)

if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection

    from batchyard.client.http import Client

EXEC_HELP = """Run a command in a job's node context: its environment (NODE_RANK, WORLD_SIZE,
MASTER_ADDR, AZ_BATCHAI_*, ...), its working directory and its container when it has one.

`batchyard job exec JOB -- nvidia-smi`

`batchyard job exec -n JOB --node 1 -it` (an interactive shell on node rank 1)

`batchyard job exec -n JOB -it -- python`

Without -t the command's stdout and stderr stream back apart and the exit code is its own;
-i passes this terminal's stdin. -it gives a real terminal (raw mode, window size, Ctrl-C
goes to the remote command); `exit` or Ctrl-D ends it. The job must be running, or failed
with its nodes still held by limits.keep_alive_on_failure (the job then shows `failed`
with the pending note "nodes held until HH:MM:SS UTC", until that time or until
`job terminate` releases them). Every exec is recorded in the job's events. No --output
json: what it prints is the command's own output."""


def exec_command(ctx: typer.Context,
                 words: list[str] = typer.Argument(None, metavar="[JOB] -- CMD...",
                                                   show_default=False),
                 name: str = typer.Option(None, "--name", "-n", help="The job's name (or "
                                          "give it as JOB)."),
                 node: int = typer.Option(0, "--node", help="The node rank to run on.",
                                          show_default=True),
                 stdin: bool = typer.Option(False, "--stdin", "-i", help="Pass stdin."),
                 tty: bool = typer.Option(False, "--tty", "-t", help="A terminal (with -i: "
                                          "an interactive session)."),
                 workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt) -> None:
    with handled():
        words = list(words or []) + list(ctx.args)
        if name is None:
            if not words:
                fail("give the job: JOB or -n JOB (then -- CMD, or -it for a shell)")
            name, words = words[0], words[1:]
        if not words and not tty:
            fail("give a command after --, or -it for an interactive shell")
        if node < 0:
            fail(f"--node {node}: a node rank (0, 1, ...)")
        from batchyard.cli.job import locate

        c = client()
        path, _ = locate(c, workspace, experiment, name)
        code = run_session(c, f"{path}/exec", words, stdin=stdin or tty, tty=tty,
                           extra={"node": node})
    raise typer.Exit(code)


def _size() -> tuple[int, int]:
    for fd in (sys.stdout.fileno(), sys.stdin.fileno()):
        with contextlib.suppress(OSError, ValueError):
            size = os.get_terminal_size(fd)
            return size.lines or 24, size.columns or 80
    return 24, 80


def _user() -> str:
    import getpass
    import socket

    with contextlib.suppress(Exception):
        return f"{getpass.getuser()}@{socket.gethostname()}"
    return ""


def connect(c: Client, path: str, argv: list[str], tty: bool,
            extra: dict[str, Any]) -> ClientConnection:
    """The session's socket; a refusal (bad node, job not running, no access) comes back as
    the server's own error."""
    from websockets.exceptions import InvalidStatus, WebSocketException
    from websockets.sync.client import connect as ws_connect

    from batchyard.client.http import API, verify_for

    rows, cols = _size()
    query = [("argv", a) for a in argv] + [(k, str(v)) for k, v in extra.items()]
    query += [("tty", "1" if tty else "0"), ("rows", str(rows)), ("cols", str(cols)),
              ("term", os.environ.get("TERM") or "xterm"), ("user", _user())]
    url = c.url.replace("http", "ws", 1) + API + path + "?" + urlencode(query)
    context = verify_for(c.url) if c.url.startswith("https:") else None
    headers = {"Authorization": f"Bearer {c.token}"} if c.token else {}
    try:
        return ws_connect(url, additional_headers=headers, open_timeout=30, max_size=None,
                          ssl=context if not isinstance(context, bool) else None,
                          compression=None)
    except InvalidStatus as exc:
        response = exc.response
        try:
            body = json.loads(response.body or b"{}").get("error") or {}
        except ValueError:
            body = {}
        raise errors.from_dict(body or {"message": f"HTTP {response.status_code}"},
                               response.status_code) from None
    except (OSError, WebSocketException) as exc:
        raise errors.ServerUnavailable(f"could not open the exec session: {exc}") from None


def run_session(c: Client, path: str, argv: list[str], *, stdin: bool, tty: bool,
                extra: dict[str, Any]) -> int:
    """Relay this terminal (or stdin/stdout/stderr) to the session; the remote exit code."""
    if tty and not os.isatty(sys.stdin.fileno()):
        fail("-t needs a terminal on stdin (leave -t out to pipe stdin with -i)")
    ws = connect(c, path, argv, tty, extra)
    result: dict[str, Any] = {}
    done = threading.Event()
    receiver = threading.Thread(target=_receive, args=(ws, result, done), daemon=True)
    restore = _raw(tty)
    old_winch = None
    try:
        receiver.start()
        resized = threading.Event()
        if tty:
            old_winch = signal.signal(signal.SIGWINCH, lambda *_: resized.set())
        if stdin:
            _pump_stdin(ws, done, resized)
        else:
            ws.send(json.dumps({"eof": True}))
        done.wait()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        if old_winch is not None:
            signal.signal(signal.SIGWINCH, old_winch)
        restore()
        with contextlib.suppress(Exception):
            ws.close()
    if result.get("error"):
        sys.stderr.write(("\r" if tty else "") + f"batchyard: {result['error']}\n")
    if result.get("exit_code") is None:
        sys.stderr.write("batchyard: the exec session ended without an exit code\n")
        return 255
    return int(result["exit_code"])


def _raw(tty: bool) -> Any:
    if not tty:
        return lambda: None
    import termios
    import tty as tty_mod

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty_mod.setraw(fd, termios.TCSANOW)  # (what was typed ahead is kept, and sent)
    return lambda: termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _pump_stdin(ws: ClientConnection, done: threading.Event, resized: threading.Event) -> None:
    """stdin to the session; a window size change (SIGWINCH sets ``resized``: a signal
    handler must not send on the socket itself) goes with the next look."""
    import select

    fd = sys.stdin.fileno()
    while not done.is_set():
        if resized.is_set():
            resized.clear()
            ws.send(json.dumps({"resize": list(_size())}))
        ready, _, _ = select.select([fd], [], [], 0.05)
        if not ready:
            continue
        data = os.read(fd, 1 << 16)
        if not data:
            ws.send(json.dumps({"eof": True}))
            return
        ws.send(data)


def _receive(ws: ClientConnection, result: dict[str, Any], done: threading.Event) -> None:
    from websockets.exceptions import ConnectionClosed

    out, err = sys.stdout.buffer, sys.stderr.buffer
    try:
        for message in ws:
            if isinstance(message, bytes):
                target = err if message[:1] == b"\x02" else out
                target.write(message[1:])
                target.flush()
            else:
                with contextlib.suppress(ValueError):
                    result.update(json.loads(message))
    except ConnectionClosed:
        pass
    finally:
        done.set()
