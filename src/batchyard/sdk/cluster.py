"""Clusters from Python: create (manual or autoscale), inspect, resize, delete."""

from __future__ import annotations

import os
import time
from typing import Any

from batchyard import errors
from batchyard.client.http import Client
from batchyard.sdk.workspace import Workspace


class Cluster:
    """A named pool of nodes. ``data`` is the server's view at the last refresh."""

    def __init__(self, workspace: Workspace | str, name: str, *,
                 data: dict[str, Any] | None = None) -> None:
        self.workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        self.name = name
        self.data: dict[str, Any] = data or {}

    def __repr__(self) -> str:
        return f"Cluster({self.workspace.name}/{self.name})"

    @property
    def client(self) -> Client:
        return self.workspace.client

    @property
    def path(self) -> str:
        return f"/workspaces/{self.workspace.name}/clusters/{self.name}"

    @classmethod
    def create(cls, workspace: Workspace | str, name: str, *, vm_size: str | None = None,
               nodes: int | None = None, min_nodes: int | None = None,
               max_nodes: int | None = None, initial_nodes: int | None = None,
               idle_seconds_before_scaledown: float | None = None,
               vm_priority: str = "dedicated", cpus: int | None = None,
               gpus: int | None = None, memory_gb: float | None = None,
               backend: str | None = None, address: str | None = None,
               slurm: dict[str, Any] | None = None, exist_ok: bool = False,
               wait: bool = False, timeout: float = 600.0) -> Cluster:
        """``nodes`` gives a fixed size; ``max_nodes`` (with ``min_nodes``) an autoscale
        range. ``vm_size`` names a catalog size, or give ``cpus``/``gpus``/``memory_gb``.
        ``backend`` defaults to ``$BATCHYARD_BACKEND`` (else local); a slurm cluster's
        ``slurm`` settings (partition, account, qos, constraint, options, work_dir) default
        to ``$BATCHYARD_SLURM_PARTITION`` etc. (see :func:`slurm_defaults`). ``wait``: return
        once the nodes are idle (``timeout`` seconds at most)."""
        cluster = cls(workspace, name)
        backend = backend or default_backend()
        body: dict[str, Any] = {"name": name, "backend": backend, "vm_priority": vm_priority}
        if backend == "slurm":
            body["slurm"] = {**slurm_defaults(), **(slurm or {})}
        if vm_size:
            body["vm_size"] = vm_size
        if cpus is not None:
            body["resources"] = {"cpus": cpus, "gpus": gpus or 0,
                                 **({"memory_gb": memory_gb} if memory_gb else {})}
        if address:
            body["address"] = address
        if max_nodes is not None:
            auto: dict[str, Any] = {"min_nodes": min_nodes or 0, "max_nodes": max_nodes}
            if initial_nodes is not None:
                auto["initial_node_count"] = initial_nodes
            if idle_seconds_before_scaledown is not None:
                auto["idle_seconds_before_scaledown"] = idle_seconds_before_scaledown
            body["autoscale"] = auto
        elif nodes is not None:
            body["manual"] = {"target_node_count": nodes}
        try:
            cluster.data = cluster.client.post(f"/workspaces/{cluster.workspace.name}/clusters",
                                               body)
        except errors.Conflict:
            if not exist_ok:
                raise
            cluster.refresh()
        for warning in (cluster.data or {}).get("warnings") or []:
            import warnings

            warnings.warn(warning, stacklevel=2)
        if wait:  # as `cluster create --wait`: until the nodes are idle
            cluster.wait_ready(timeout=timeout)
        return cluster

    @classmethod
    def get(cls, workspace: Workspace | str, name: str) -> Cluster:
        cluster = cls(workspace, name)
        cluster.refresh()
        return cluster

    def refresh(self) -> dict[str, Any]:
        self.data = self.client.get(self.path)
        return self.data

    def nodes(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.client.get(self.path + "/nodes")
        return rows

    def resize(self, target: int) -> dict[str, Any]:
        self.data = self.client.post(self.path + "/resize", {"target": target})
        return self.data

    def delete(self) -> None:
        self.client.delete(self.path)

    def wait_ready(self, min_nodes: int | None = None, timeout: float = 600.0,
                   poll: float = 0.5) -> dict[str, Any]:
        """Wait until the cluster is steady with at least ``min_nodes`` (default: its target)
        nodes and none still preparing. Raises TimeoutError past ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            data = self.refresh()
            wanted = data.get("target_nodes", 0) if min_nodes is None else min_nodes
            counts = data.get("node_counts") or {}
            if (data.get("allocation_state") == "steady" and data.get("current_nodes", 0) >= wanted
                    and not counts.get("preparing")):
                return data
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster {self.name} not ready after {timeout:g}s: {counts}")
            time.sleep(poll)


def default_backend() -> str:
    """Where new clusters go when nothing says: ``$BATCHYARD_BACKEND`` (e.g. ``slurm`` on a
    Slurm login node, so that unchanged notebooks create Slurm-backed compute targets)."""
    return os.environ.get("BATCHYARD_BACKEND") or "local"


def slurm_defaults() -> dict[str, Any]:
    keys = ("partition", "account", "qos", "constraint", "work_dir")
    return {k: os.environ[f"BATCHYARD_SLURM_{k.upper()}"] for k in keys
            if os.environ.get(f"BATCHYARD_SLURM_{k.upper()}")}
