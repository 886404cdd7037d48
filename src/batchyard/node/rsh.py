"""The rsh agent Open MPI calls instead of ssh: ``agent HOST COMMAND...``.

HOST is a node name from the hostfile. The agent asks the server to relay COMMAND (joined and
given to bash, as ssh would) to that node's launcher, which runs it inside the node's job
context (environment, process tag, directories), so teardown there finds everything mpirun
started. It then waits for the command's exit code. No ssh, and no shared disk: the request
and its result cross the node channel like everything else.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from batchyard.launchplan import Ticket
from batchyard.node.channel import Channel, ChannelError

WAIT = 20.0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--ticket":
        print("usage: batchyard-rsh --ticket FILE HOST COMMAND...", file=sys.stderr)
        return 2
    channel = Channel(Ticket.load(Path(args[1])))
    rest = args[2:]
    while rest and rest[0].startswith("-"):  # ssh-style options mpirun may add (e.g. -x)
        rest = rest[1:]
    host, command = rest[0], rest[1:]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    deadline = time.time() + 120.0
    try:
        started = channel.retrying("POST", "/relay", {"host": host, "command": " ".join(command)},
                                   deadline=deadline)
    except ChannelError as exc:
        print(f"batchyard-rsh: {exc}", file=sys.stderr)
        return 255
    ident = started["id"]
    while True:
        try:
            result = channel.retrying("GET", f"/relay/{ident}?wait={WAIT:g}",
                                      deadline=time.time() + 600.0, timeout=WAIT + 10)
        except ChannelError as exc:
            print(f"batchyard-rsh: {exc}", file=sys.stderr)
            return 255
        if result.get("done"):
            return int(result.get("exit_code") or 0)


if __name__ == "__main__":
    sys.exit(main())
