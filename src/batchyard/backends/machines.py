"""Machines you own, each running `batchyard agent` (like Slurm's slurmd or dstack's shim).

Nodes are not provisioned: they join with a cluster-scoped token and heartbeat. Nothing is
pushed to an agent: its heartbeat asks the server which (attempt, node rank) pairs it should
be running, and it starts, re-attaches to or sweeps its launchers to match. So ``launch``
has nothing to do but answer a handle, and a launcher's liveness is what its agent reports
(a node whose heartbeats stop is lost; see server.services.agents)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from batchyard.backends.base import Gang, NodeInfo
from batchyard.backends.dryrun import render_dry_run
from batchyard.errors import Unsupported

# Set by the server at start: runs argv on a node through its agent (a queued command the
# agent takes with its heartbeat), returning (exit code, stdout, stderr).
ExecHook = Callable[[NodeInfo, list[str], float], tuple[int, str, str]]
_exec_hook: ExecHook | None = None


def set_exec_hook(hook: ExecHook) -> None:
    global _exec_hook
    _exec_hook = hook


class MachinesBackend:
    name = "machines"
    joins = True

    def provision_node(self, cluster: str, workspace: str, index: int,
                       size: dict[str, Any]) -> NodeInfo:
        raise Unsupported(f"cluster {cluster!r}: machines join by themselves; run `batchyard "
                          f"cluster join-command -n {cluster}` and the line it prints on each")

    def remove_node(self, node: NodeInfo) -> None:
        """The agent is told by its next heartbeat (the node is gone) and stops."""

    def dry_run(self, gang: Gang) -> str:
        return render_dry_run(gang)

    def launch(self, gang: Gang) -> dict[str, Any]:
        return {"backend": self.name, "nodes": [n.name for n in gang.nodes],
                "launched_at": time.time()}

    def alive(self, handle: dict[str, Any]) -> list[bool | None]:
        """Unknown here: agents report dead launchers, and lost nodes, to the server."""
        return [None] * len(handle.get("nodes") or [])

    def stop(self, handle: dict[str, Any], node_rank: int) -> None:
        """Agents sweep, by process tag, every launcher of an attempt the server no longer
        lists for them, once they can reach it."""

    def exec(self, node: NodeInfo, argv: list[str], timeout: float) -> tuple[int, str, str]:
        if _exec_hook is None:
            raise Unsupported("exec on machines needs the server's agent channel")
        return _exec_hook(node, argv, timeout)
