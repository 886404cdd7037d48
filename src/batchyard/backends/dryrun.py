"""`job create --dry-run`: what would run on each node, rendered from the very plans the
launchers would fetch (TorchX's materialize), secrets masked."""

from __future__ import annotations

import json
import shlex
import sys

from batchyard.backends.base import Gang
from batchyard.backends.plans import build_plans
from batchyard.launchplan import PORT_FROM_RENDEZVOUS


def render_dry_run(gang: Gang) -> str:
    from batchyard.node.env import node_dirs, node_env, rank_env
    from batchyard.node.launcher import Launcher

    lines: list[str] = []
    masked = set((gang.spec.get("secrets") or {}).keys())
    for plan in build_plans(gang):
        plan.api_token = "***" if plan.api_token else None
        if plan.master_port == PORT_FROM_RENDEZVOUS:
            lines.append("# MASTER_PORT (and TF task ports) are chosen on the nodes at start")
        dirs = node_dirs(plan)
        base = node_env(plan, dirs)
        address = plan.node_addrs[plan.node_rank]
        lines.append(f"# node {plan.node_rank}: {plan.node_name} ({address})")
        lines.append(f"launcher: {sys.executable} -m batchyard.node <ticket>")
        if plan.prepare:
            shown = plan.prepare if isinstance(plan.prepare, str) else shlex.join(plan.prepare)
            lines.append(f"prepare: {shown}")
        commands = Launcher(plan).commands()
        for local, argv in commands:
            env = rank_env(plan, base, local)
            rank = plan.node_rank * plan.processes_per_node + local
            lines.append(f"rank {rank} (local {local}): {shlex.join(argv)}")
            for key in sorted(env):
                value = "***" if key in masked or key == "BATCHYARD_TOKEN" else env[key]
                lines.append(f"    {key}={json.dumps(value)}")
        if not commands:
            lines.append("(no processes of its own: its ranks are started by node 0)")
        lines.append("")
    return "\n".join(lines)
