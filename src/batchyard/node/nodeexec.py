"""``cluster node exec`` on a node, as its own process: the node's environment (without
batchyard's own variables), in its directory, its own session, bounded by a timeout. Used by
the local backend and by agents alike."""

from __future__ import annotations

import subprocess

from batchyard.node.env import merged_environ


def run_on_node(argv: list[str], node_name: str, node_dir: str,
                timeout: float) -> tuple[int, str, str]:
    env = merged_environ({"BATCHYARD_NODE_NAME": node_name, "BATCHYARD_NODE_DIR": node_dir})
    try:
        proc = subprocess.run(argv, cwd=node_dir, env=env, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
    except FileNotFoundError as exc:
        return 127, "", f"{exc}\n"
    except subprocess.TimeoutExpired as exc:
        return 124, _text(exc.stdout), _text(exc.stderr) + f"\ntimed out after {timeout}s\n"
    return proc.returncode, proc.stdout, proc.stderr


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
