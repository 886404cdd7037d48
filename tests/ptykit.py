"""The real CLI in a real terminal, for tests of interactive commands (`job exec -it`): a
pty the test types into and reads from, as a user's terminal would be."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import struct
import sys
import termios
import time
from collections.abc import Sequence
from pathlib import Path

from yardkit import Yard


class Pty:
    """A command in a real terminal (30 rows x 100 columns)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: str | Path) -> None:
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: stdin/stdout/stderr are the terminal
            try:
                os.chdir(cwd)
                os.execvpe(argv[0], list(argv), env)
            finally:
                os._exit(127)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.seen = b""

    @classmethod
    def cli(cls, yard: Yard, *args: str) -> Pty:
        """``batchyard ARGS`` with the yard's environment, in a terminal."""
        return cls([sys.executable, "-m", "batchyard.cli.main", *args],
                   {**yard.env, "TERM": "xterm"}, yard.work)

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: str, timeout: float = 60) -> re.Match[bytes]:
        deadline = time.time() + timeout
        regex = re.compile(pattern.encode())
        while True:
            found = regex.search(self.seen)
            if found:
                return found
            left = deadline - time.time()
            assert left > 0, f"{pattern!r} not seen; the terminal showed:\n{self.seen[-3000:]!r}"
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if ready:
                try:
                    self.seen += os.read(self.fd, 65536)
                except OSError:  # EIO: the CLI has exited
                    time.sleep(0.05)

    def wait(self, timeout: float = 60) -> int:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with_status = os.waitpid(self.pid, os.WNOHANG)
            if with_status[0]:
                return os.waitstatus_to_exitcode(with_status[1])
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):
                    self.seen += os.read(self.fd, 65536)
        os.kill(self.pid, 9)
        raise AssertionError(f"the CLI did not exit; it showed:\n{self.seen[-3000:]!r}")
