"""node/session.py's process side on real processes: a pty with its window size and job
control, pipes with stdout and stderr apart, stdin's end, an exit status another reaper took,
and the container argv made interactive."""

from __future__ import annotations

import os
import time

from batchyard.node.session import Process, Sessions, boxed


def _run(proc: Process, send: bytes = b"") -> tuple[dict[str, bytes], int]:
    if send:
        proc.write(send)
    got: dict[str, bytes] = {}
    for chunk in proc.chunks():
        for stream, data in chunk.items():
            got[stream] = got.get(stream, b"") + data
    return got, proc.wait()


def test_pty_has_the_size_asked_and_is_a_terminal() -> None:
    proc = Process(["sh", "-c", 'stty size; [ -t 0 ] && echo tty; read x; echo "got $x"; '
                    "exit 5"], dict(os.environ), "/", tty=True, rows=33, cols=101)
    proc.resize(40, 120)
    got, code = _run(proc, b"hello\r")
    assert code == 5
    assert set(got) == {"o"}  # a terminal has one stream
    text = got["o"].decode()
    assert "tty" in text and "got hello" in text
    assert "33 101" in text or "40 120" in text


def test_pipes_keep_stderr_apart_and_stdin_ends() -> None:
    proc = Process(["sh", "-c", "cat; echo oops >&2; exit 3"], dict(os.environ), "/",
                   tty=False)
    proc.write(b"data\n")
    proc.end_input()
    got, code = _run(proc)
    assert (got.get("o"), got.get("e"), code) == (b"data\n", b"oops\n", 3)


def test_an_exit_status_reaped_elsewhere_is_claimed() -> None:
    class Owner:  # what Sessions needs of a launcher
        channel = None

    sessions = Sessions(Owner())  # type: ignore[arg-type]
    proc = Process(["sh", "-c", "exit 6"], dict(os.environ), "/", tty=False)
    deadline = time.time() + 10
    while time.time() < deadline:  # the launcher's waitpid(-1) loop gets it first
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == proc.pid:
            break
        time.sleep(0.01)
    assert not sessions.claim(pid, status)  # not known yet: kept for it
    sessions._register(proc)
    assert proc.wait() == 6


def test_container_exec_becomes_interactive() -> None:
    argv = ["docker", "-H", "unix:///s", "exec", "-w", "/wd", "-e", "A", "box", "sh"]
    assert boxed(argv, tty=True) == ["docker", "-H", "unix:///s", "exec", "-i", "-t", "-w",
                                     "/wd", "-e", "A", "box", "sh"]
    assert boxed(argv, tty=False)[3:5] == ["exec", "-i"]
