"""What this machine offers and how the server reaches it, found on the machine itself."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


def routable_address(server_url: str) -> str:
    """The address this machine uses to reach the server: the one other nodes (and the
    server) can reach it at, whatever its hostname resolves to (often 127.0.1.1)."""
    parts = urlsplit(server_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))
        return str(sock.getsockname()[0])


def memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def resources(cpus: int | None, gpus: int | None, memory: float | None,
              work_dir: Path | None = None) -> dict[str, Any]:
    """What the machine has, or less where the admin offers less (never more). GPUs: the
    free ones of node/gpuclaims.py (nothing else on this machine, a virtual node or another
    agent, has them), taken for this agent's work dir."""
    have_cpus = os.cpu_count() or 1
    from batchyard.node import gpuclaims
    from batchyard.node.gpus import describe, discover_gpus

    devices = discover_gpus()
    if devices and work_dir is not None:
        free = len(devices) - len(gpuclaims.taken(devices, gpuclaims.agent_owner(
            str(work_dir))))
        wanted = None if gpus is None else min(max(0, gpus), free)
        devices = gpuclaims.claim(devices, wanted, gpuclaims.agent_owner(str(work_dir)))
    elif gpus is not None:
        devices = devices[: max(0, gpus)]
    have_mem = memory_gb()
    from batchyard.node.container import node_containers

    return {"cpus": min(cpus, have_cpus) if cpus else have_cpus, "gpus": len(devices),
            "gpu_ids": [d["id"] for d in devices], "gpu_devices": describe(devices),
            "memory_gb": min(memory, have_mem) if memory else have_mem,
            "machine_cpus": have_cpus, "containers": node_containers()}


def machine_id(work_dir: Path) -> str:
    """Kept in the work dir, so two agents on one host (or namespaces sharing /etc) differ,
    and a restarted agent is the same machine."""
    path = work_dir / "machine-id"
    try:
        return path.read_text().strip()
    except OSError:
        pass
    ident = uuid.uuid4().hex
    work_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(ident + "\n")
    return ident
