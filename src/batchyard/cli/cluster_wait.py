"""`cluster create --wait`: follow a new cluster until its nodes are idle, as `az batchai
cluster create` did before it returned. A Rich status line on a terminal; elsewhere one line on
stderr each time the node counts change (scripts and CI logs stay readable)."""

from __future__ import annotations

import time
from typing import Any

from batchyard.cli.common import counts, err_console, fail, stderr_is_tty
from batchyard.client.http import Client

POLL = 0.5


def ready(data: dict[str, Any]) -> bool:
    """Steady, with the target's nodes all idle (an autoscale cluster: its minimum)."""
    node_counts = data.get("node_counts") or {}
    wanted = int(data.get("target_nodes") or 0)
    return (data.get("allocation_state") == "steady" and not node_counts.get("preparing")
            and int(node_counts.get("idle") or 0) >= wanted)


def _line(data: dict[str, Any]) -> str:
    return (f"cluster {data.get('name')}: {data.get('allocation_state')}, "
            f"{data.get('current_nodes', 0)}/{data.get('target_nodes', 0)} nodes "
            f"({counts(data.get('node_counts'))})")


def wait_until_idle(client: Client, workspace: str, name: str,
                    timeout: float) -> dict[str, Any]:
    path = f"/workspaces/{workspace}/clusters/{name}"
    deadline = time.monotonic() + timeout
    last = ""
    status = err_console.status("") if stderr_is_tty() else None
    if status is not None:
        status.start()
    try:
        while True:
            data: dict[str, Any] = client.get(path)
            line = _line(data)
            if line != last:
                if status is not None:
                    status.update(line)
                else:
                    err_console.print(line, markup=False, highlight=False)
                last = line
            if ready(data):
                break
            unusable = (data.get("node_counts") or {}).get("unusable")
            if unusable and int(unusable) >= int(data.get("target_nodes") or 0) > 0:
                fail(f"cluster {name}: every node is unusable; see `batchyard cluster node "
                     f"list -c {name}`", 1)
            if time.monotonic() > deadline:
                fail(f"cluster {name} is not ready after {timeout:g}s: {line}", 1)
            time.sleep(POLL)
    finally:
        if status is not None:
            status.stop()
    err_console.print(f"cluster {name} is ready: {counts(data.get('node_counts'))}",
                      markup=False, highlight=False)
    return data
