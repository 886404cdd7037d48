"""What `srun` starts on every node of a batchyard gang on Slurm (``python -S -m
batchyard.node.slurm NODE_DIR``): picks this node's ticket by ``SLURM_NODEID``, writes it
(mode 0600) and the server's CA under the node's work dir, and becomes the node launcher.

The tickets arrive on stdin (``srun --input=all`` broadcasts the batch script's here-document),
never in an environment a rank could read. Standard library only."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from batchyard.launchplan import Ticket, ticket_path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -S -m batchyard.node.slurm NODE_DIR  (tickets on stdin)",
              file=sys.stderr)
        return 2
    node_dir = argv[1]
    rank = int(os.environ.get("SLURM_NODEID", "0"))
    bundle = json.loads(sys.stdin.readline())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    tickets = bundle["tickets"]
    if not 0 <= rank < len(tickets):
        print(f"batchyard: SLURM_NODEID {rank} has no ticket ({len(tickets)} nodes)",
              file=sys.stderr)
        return 2
    Path(node_dir).mkdir(parents=True, exist_ok=True)
    ca_file = None
    if bundle.get("ca_pem"):
        ca = Path(node_dir, "tickets", f"{bundle['attempt']}.ca.pem")
        ca.parent.mkdir(parents=True, exist_ok=True)
        ca.write_text(bundle["ca_pem"])
        ca_file = str(ca)
    ticket = Ticket(server=bundle["server"], token=tickets[rank], attempt=bundle["attempt"],
                    node_rank=rank, node_dir=node_dir, ca_file=ca_file,
                    servers=list(bundle.get("servers") or []))
    path = ticket_path(node_dir, ticket.attempt, rank)
    ticket.save(path)
    os.environ["BATCHYARD_LAUNCHER"] = "1"
    os.execv(sys.executable, [sys.executable, "-S", "-m", "batchyard.node", str(path)])
    return 1  # pragma: no cover (execv does not return)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
