"""The rsh agent Open MPI calls instead of ssh: ``agent HOST COMMAND...``.

HOST is a node name from the hostfile. The agent runs COMMAND (joined and given to bash, as
ssh would) inside that node's job context: its environment, process tag and directories, so
the node's launcher can find and stop everything mpirun started there. On the local backend
the node's context is on this machine; other backends route through their exec channel.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from batchyard.node.env import merged_environ, node_dirs, node_env
from batchyard.node.plan import AttemptPaths, NodePlan


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--attempt-dir":
        print("usage: batchyard-rsh --attempt-dir DIR HOST COMMAND...", file=sys.stderr)
        return 2
    paths = AttemptPaths(Path(args[1]))
    rest = args[2:]
    while rest and rest[0].startswith("-"):  # ssh-style options mpirun may add (e.g. -x)
        rest = rest[1:]
    host, command = rest[0], rest[1:]
    plan = _plan_for(paths, host)
    if plan is None:
        print(f"batchyard-rsh: no node named {host!r} in this job", file=sys.stderr)
        return 255
    dirs = node_dirs(plan)
    env = node_env(plan, dirs)
    env["PATH"] = os.environ.get("PATH", "")  # mpirun's PATH: already the job's interpreter
    os.chdir(dirs.workdir if dirs.workdir.is_dir() else "/")
    os.execvpe("bash", ["bash", "-c", " ".join(command)], merged_environ(env))
    return 0  # not reached


def _plan_for(paths: AttemptPaths, host: str) -> NodePlan | None:
    for plan_file in sorted(paths.control.glob("node-*.plan.json")):
        plan = NodePlan.load(plan_file)
        if plan.node_name == host or plan.node_addrs[plan.node_rank] == host:
            return plan
    return None


if __name__ == "__main__":
    sys.exit(main())
