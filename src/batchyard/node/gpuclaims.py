"""Which of a machine's GPUs belong to whom, so that nothing on one machine shares a GPU
without knowing it: the local backend's virtual nodes (each a slice of the machine) and any
`batchyard agent` running there, whichever server they belong to.

Every claim is a file in one directory per machine (``claims_dir``), named by the GPU's UUID
(else its index), saying who holds it: a virtual node (its directory: the claim lasts while
the node exists, until the backend removes the node and releases it) or an agent (its work
dir: the claim lasts while that exists, as a stopped agent's launchers keep running and a
restarted one is the same machine). Claims are read and written under an exclusive lock on the
directory, so two servers or agents starting at once never take the same GPU. A GPU whose
holder is gone is free again.
Standard library only (agents import it)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchyard.node import gpus as gpu_info

ENV = "BATCHYARD_GPU_CLAIMS"


class NotEnoughGpus(Exception):
    """Fewer free GPUs on this machine than asked for."""


def claims_dir() -> Path:
    """``$BATCHYARD_GPU_CLAIMS``, else /var/lib/batchyard/gpu-claims (root) or the user's
    ~/.local/state/batchyard/gpu-claims."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    if os.geteuid() == 0:
        return Path("/var/lib/batchyard/gpu-claims")
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "batchyard" / "gpu-claims"


def local_owner(node_dir: str, node: str) -> dict[str, Any]:
    return {"kind": "local", "key": f"local:{node_dir}", "node_dir": node_dir, "node": node}


def agent_owner(work_dir: str) -> dict[str, Any]:
    return {"kind": "agent", "key": f"agent:{work_dir}", "work_dir": work_dir}


def holds(owner: dict[str, Any]) -> bool:
    """Whether a claim's holder still exists: a virtual node's directory, an agent's work
    dir (its identity: a restarted agent is the same machine, and the launchers of a stopped
    one keep running on its GPUs)."""
    where = owner.get("node_dir") if owner.get("kind") == "local" else owner.get("work_dir")
    return bool(where) and os.path.isdir(str(where))


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    folder = claims_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder


def _read(folder: Path) -> dict[str, dict[str, Any]]:
    """GPU key -> its holder, for the claims whose holder still exists."""
    out = {}
    for path in folder.glob("*.json"):
        try:
            owner = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(owner, dict) and holds(owner):
            out[path.stem] = owner
    return out


def _file(folder: Path, key: str) -> Path:
    return folder / (key.replace("/", "_") + ".json")


def taken(gpus: list[dict[str, Any]], owner: dict[str, Any] | None = None) -> dict[str, str]:
    """GPU key -> who holds it, for the ``gpus`` held by someone other than ``owner``."""
    mine = (owner or {}).get("key")
    with _locked() as folder:
        held = _read(folder)
    return {gpu_info.key_of(g): _who(held[gpu_info.key_of(g)]) for g in gpus
            if gpu_info.key_of(g) in held and held[gpu_info.key_of(g)].get("key") != mine}


def _who(owner: dict[str, Any]) -> str:
    if owner.get("kind") == "local":
        return f"virtual node {owner.get('node')} ({owner.get('node_dir')})"
    return f"the agent whose work dir is {owner.get('work_dir')}"


def claim(gpus: list[dict[str, Any]], wanted: int | None,
          owner: dict[str, Any]) -> list[dict[str, Any]]:
    """Take ``wanted`` of ``gpus`` (None: every free one) for ``owner``, those it holds
    already first; NotEnoughGpus, taking nothing, when fewer are free."""
    with _locked() as folder:
        held = _read(folder)
        mine = [g for g in gpus if held.get(gpu_info.key_of(g), {}).get("key") == owner["key"]]
        free = [g for g in gpus if gpu_info.key_of(g) not in held]
        pool = mine + free
        count = len(pool) if wanted is None else wanted
        if count > len(pool):
            others = sorted({_who(o) for k, o in held.items() if o.get("key") != owner["key"]
                             and k in {gpu_info.key_of(g) for g in gpus}})
            raise NotEnoughGpus(
                f"needs {count} GPU(s) but {len(pool)} of this machine's {len(gpus)} are "
                f"free" + (f" (held by {', '.join(others)})" if others else ""))
        chosen = sorted(pool[:count], key=lambda g: gpus.index(g))
        keep = {gpu_info.key_of(g) for g in chosen}
        for key, holder in held.items():  # what it held beyond what it keeps now
            if holder.get("key") == owner["key"] and key not in keep:
                _file(folder, key).unlink(missing_ok=True)
        for key in keep:
            path = _file(folder, key)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(owner))
            os.replace(tmp, path)
        return chosen


def release(owner_key: str) -> int:
    """Give back every GPU ``owner_key`` holds; returns how many."""
    with _locked() as folder:
        count = 0
        for path in folder.glob("*.json"):
            try:
                owner = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(owner, dict) and owner.get("key") == owner_key:
                path.unlink(missing_ok=True)
                count += 1
        return count
