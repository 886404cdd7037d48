"""What `srun` starts on every node of a batchyard gang on Slurm (``python -S -m
batchyard.node.slurm NODE_DIR``): picks this node's ticket by ``SLURM_NODEID``, writes it
(mode 0600) and the server's CA under the node's work dir, and runs the node launcher in
this same process (a second interpreter cost every node a cold Python start).

The tickets arrive on stdin (``srun --input=all`` broadcasts the batch script's here-document),
never in an environment a rank could read. The ticket carries the allocation Slurm started
this node in (``Ticket.allocation``): the launcher's plan request is the gang's start
callback, so the server needs no ``squeue`` to learn where it runs. Standard library only."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from batchyard.launchplan import Ticket, ticket_path

if TYPE_CHECKING:
    from batchyard.node.channel import Channel

START_DEADLINE = 600.0  # node.launcher's: how long a node waits for the server and its plan
USAGE = "usage: python -S -m batchyard.node.slurm NODE_DIR  (tickets on stdin)"


def allocation(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """This node's Slurm job, its node list (Slurm's compressed form) and this node's name."""
    return {"job": environ.get("SLURM_JOB_ID", ""),
            "nodes": environ.get("SLURM_JOB_NODELIST", ""),
            "node": environ.get("SLURMD_NODENAME", "")}


def take_ticket(node_dir: str, stdin: IO[str]) -> Path:
    """This node's ticket from the bundle on ``stdin``, saved 0600; stdin is closed after
    (the launcher's children never see the other nodes' tickets)."""
    rank = int(os.environ.get("SLURM_NODEID", "0"))
    bundle = json.loads(stdin.readline())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    tickets = bundle["tickets"]
    if not 0 <= rank < len(tickets):
        raise ValueError(f"SLURM_NODEID {rank} has no ticket ({len(tickets)} nodes)")
    Path(node_dir).mkdir(parents=True, exist_ok=True)
    ca_file = None
    if bundle.get("ca_pem"):
        ca = Path(node_dir, "tickets", f"{bundle['attempt']}.ca.pem")
        ca.parent.mkdir(parents=True, exist_ok=True)
        ca.write_text(bundle["ca_pem"])
        ca_file = str(ca)
    ticket = Ticket(server=bundle["server"], token=tickets[rank], attempt=bundle["attempt"],
                    node_rank=rank, node_dir=node_dir, ca_file=ca_file,
                    servers=list(bundle.get("servers") or []),
                    allocation=allocation() if os.environ.get("SLURM_JOB_ID") else None)
    path = ticket_path(node_dir, ticket.attempt, rank)
    ticket.save(path)
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        path = take_ticket(argv[1], sys.stdin)
    except ValueError as exc:
        print(f"batchyard: {exc}", file=sys.stderr)
        return 2
    os.environ["BATCHYARD_LAUNCHER"] = "1"
    from batchyard.node.channel import Channel

    channel = Channel(Ticket.load(path))
    fetch = _PlanFetch(channel)
    fetch.start()  # the server binds the gang and builds the plan while the launcher imports
    from batchyard.node.launcher import with_plan

    return with_plan(str(path), channel, fetch.result()).run()


class _PlanFetch(threading.Thread):
    def __init__(self, channel: Channel) -> None:
        super().__init__(name="plan", daemon=True)
        self.channel = channel
        self.plan: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.plan = self.channel.fetch_plan(time.time() + START_DEADLINE)
        except BaseException as exc:  # raised again on the main thread
            self.error = exc

    def result(self) -> dict[str, Any]:
        self.join()
        if self.error is not None:
            raise self.error
        assert self.plan is not None
        return self.plan


if __name__ == "__main__":
    sys.exit(main(sys.argv))
