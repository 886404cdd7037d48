"""Backends run gangs on nodes. A lazy registry (name -> module path) keeps optional engines
such as Ray out of the import graph until a cluster uses them."""

from __future__ import annotations

import importlib
import importlib.util

from batchyard.backends.base import Backend
from batchyard.errors import SpecError

_REGISTRY = {
    "local": "batchyard.backends.local:LocalBackend",
    "machines": "batchyard.backends.machines:MachinesBackend",
    "ray": "batchyard.backends.ray:RayBackend",
    "slurm": "batchyard.backends.slurm:SlurmBackend",
}


_INSTANCES: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """One instance per backend for the process (built on first use), so a backend can keep
    its state (connections, caches) on itself rather than in module globals."""
    cached = _INSTANCES.get(name)
    if cached is not None:
        return cached
    target = _REGISTRY.get(name)
    if target is None:
        raise SpecError(f"backend: unknown backend {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    module, _, attr = target.partition(":")
    if name == "ray" and importlib.util.find_spec("ray") is None:
        raise SpecError("backend: the ray backend needs Ray: pip install 'batchyard[ray]'")
    cls = getattr(importlib.import_module(module), attr)
    backend: Backend = cls()
    _INSTANCES[name] = backend
    return backend


def available() -> list[str]:
    return sorted(_REGISTRY)
