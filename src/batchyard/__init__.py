"""batchyard: clusters and distributed training jobs on machines you own.

Kept import-light on purpose: the node launcher and rank processes import this package, and
every millisecond here is paid once per rank at job start. The SDK names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Workspace": "batchyard.sdk.workspace",
    "Cluster": "batchyard.sdk.cluster",
    "Experiment": "batchyard.sdk.experiment",
    "Job": "batchyard.sdk.job",
    "Run": "batchyard.sdk.job",
    "JobSpec": "batchyard.spec.job",
    "log_metric": "batchyard.sdk.metrics",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'batchyard' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
