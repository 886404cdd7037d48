"""What a launcher that died without its last word left unsent: the tail of its log files,
still on the node's disk. Whoever sweeps after it on the node (the local backend, an agent)
ships that tail with the dead launcher's own ticket, so the server's copy keeps every line
written before the end (standard library only, like the launcher)."""

from __future__ import annotations

import time
from pathlib import Path

from batchyard.launchplan import NodePlan, Ticket
from batchyard.node.channel import Channel
from batchyard.node.plan import AttemptPaths


def salvage_logs(ticket_file: Path, timeout: float = 30.0) -> bool:
    """True when the server's copy has every byte of the node's log files."""
    try:
        ticket = Ticket.load(ticket_file)
    except (OSError, ValueError):
        return False
    plans = list(Path(ticket.node_dir).glob(
        f"workspaces/*/experiments/*/jobs/*/{ticket.attempt}/.batchyard/"
        f"node-{ticket.node_rank}.plan.json"))
    if not plans:
        return True  # it died before it had a plan: it wrote no log
    from batchyard.node.env import node_dirs

    plan = NodePlan.load(plans[0])
    channel = Channel(ticket)
    dirs = {node_dirs(plan).stdouterr, AttemptPaths(Path(plan.attempt_dir)).stdouterr}
    deadline = time.time() + timeout
    for folder in dirs:
        channel.ship_logs(folder)
        while not channel._ship_once():
            if time.time() > deadline:
                return False
            time.sleep(0.2)
    return True
