"""`job create --dry-run`: what would run on each node, rendered from the very plans the
launchers would fetch (TorchX's materialize), secrets masked."""

from __future__ import annotations

import json
import shlex
import sys
from typing import TYPE_CHECKING

from batchyard.backends.base import Gang
from batchyard.backends.plans import build_plans
from batchyard.launchplan import PORT_FROM_RENDEZVOUS, NodePlan

if TYPE_CHECKING:
    from batchyard.node.env import NodeDirs
    from batchyard.node.launcher import Launcher


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
        launcher = Launcher(plan)
        box = _container_lines(gang, plan, launcher, dirs, lines)
        if plan.prepare:
            shown = plan.prepare if isinstance(plan.prepare, str) else shlex.join(plan.prepare)
            lines.append(f"prepare{box}: {shown}")
        commands = launcher.commands()
        for local, argv in commands:
            env = rank_env(plan, base, local)
            rank = plan.node_rank * plan.processes_per_node + local
            lines.append(f"rank {rank} (local {local}){box}: {shlex.join(argv)}")
            for key in sorted(env):
                value = "***" if key in masked or key == "BATCHYARD_TOKEN" else env[key]
                lines.append(f"    {key}={json.dumps(value)}")
        if not commands:
            lines.append("(no processes of its own: its ranks are started by node 0)")
        lines.append("")
    return "\n".join(lines)


def _container_lines(gang: Gang, plan: NodePlan, launcher: Launcher, dirs: NodeDirs,
                     lines: list[str]) -> str:
    """The node's pull and ``run`` lines, for the runtime the node reported; returns the
    suffix that says its processes run in that container."""
    if not launcher.boxed or plan.container is None:
        return ""
    from batchyard.node import container

    found = gang.nodes[plan.node_rank].resources.get("containers") or {}
    runtime = str(found.get("runtime") or "docker")
    if not found:
        lines.append(f"# node {plan.node_name} reported no container runtime: it cannot run "
                     "this job; shown for docker")
    image = str(plan.container["image"])
    registry = plan.container.get("registry") or {}
    auth = " (with the registry credentials, never shown)" if registry.get("username") else ""
    policy = plan.container.get("pull_policy") or "if_missing"
    lines.append(f"pull ({policy}){auth}: {runtime} pull {shlex.quote(image)}")
    argv = launcher.box_run_argv(dirs, runtime, [runtime])
    lines.append(f"container: {container.render(argv)}")
    name = container.container_name(plan.attempt_uuid, plan.node_rank)
    return f" [{runtime} exec -w {dirs.workdir} -e ... {name}]"
