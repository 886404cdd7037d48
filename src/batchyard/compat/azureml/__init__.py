"""The ``azureml`` SDK (v1) surface of the Azure ML Compute era, on batchyard.

Module paths mirror azureml's, so ``from azureml.X import Y`` becomes
``from batchyard.compat.azureml.X import Y``. Workspaces, compute targets, experiments and
runs are batchyard workspaces, clusters, experiments and jobs on the batchyard server (the
local one, started on demand, unless one is configured). Docker images run as containers on
the nodes (Docker or Podman). What batchyard cannot honour (conda, image builds, Azure
resources) raises :class:`UnsupportedParameterError` naming the
parameter; see ``docs/migrating-from-azureml.md`` for the whole mapping.
"""

from __future__ import annotations

from typing import Any

_SUBMODULES = ("core", "data", "exceptions", "telemetry", "train", "widgets")


def __getattr__(name: str) -> Any:
    """``from batchyard.compat import azureml; azureml.core.VERSION`` works like azureml's."""
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
