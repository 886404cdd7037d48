"""A pre-started, single-threaded process that forks node launchers on request.

Starting a Python interpreter costs 100-200 ms on a small machine; forking one that has
already imported the launcher costs about one. The server writes ``TICKET LOG`` lines to the
zygote's stdin and reads back ``PID START_TIME`` lines. Each launcher starts its own session
at once, so it is as detached as a freshly spawned one; when the server goes away the zygote
sees end-of-file and exits, and running launchers carry on.
"""

from __future__ import annotations

import os
import sys

from batchyard.node import proctree
from batchyard.node.launcher import from_ticket


def _child(ticket_path: str, log_path: str) -> None:
    os.setsid()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.closerange(3, 1024)
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    code = 1
    try:
        launcher = from_ticket(ticket_path)
        # A forked launcher keeps the zygote's command line; its working directory (the
        # attempt's) is what tells an operator, or a test's clean-up, whose launcher it is.
        os.makedirs(launcher.plan.attempt_dir, exist_ok=True)
        os.chdir(launcher.plan.attempt_dir)
        code = launcher.run()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    import signal

    signal.signal(signal.SIGCHLD, lambda *_: proctree.reap_children())
    stdin, stdout = sys.stdin, sys.stdout
    for line in stdin:
        proctree.reap_children()
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 2:
            stdout.write("error\n")
            stdout.flush()
            continue
        pid = os.fork()
        if pid == 0:
            _child(parts[0], parts[1])
        stdout.write(f"{pid}\t{proctree.start_time(pid)}\n")
        stdout.flush()
    proctree.reap_children()
    return 0


if __name__ == "__main__":
    sys.exit(main())
