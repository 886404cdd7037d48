"""azureml.core: ``VERSION`` and the core classes (loaded on first use, so that a rank doing
``from batchyard.compat.azureml.core.run import Run`` pays only for what it uses)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchyard import __version__

# The azureml SDK release the seeds were written with, and the batchyard that stands in.
VERSION = f"1.0.2+batchyard.{__version__}"

if TYPE_CHECKING:
    from batchyard.compat.azureml.core.compute import ComputeTarget
    from batchyard.compat.azureml.core.conda_dependencies import CondaDependencies
    from batchyard.compat.azureml.core.datastore import Datastore
    from batchyard.compat.azureml.core.environment import Environment
    from batchyard.compat.azureml.core.experiment import Experiment
    from batchyard.compat.azureml.core.run import Run
    from batchyard.compat.azureml.core.runconfig import RunConfiguration
    from batchyard.compat.azureml.core.script_run_config import ScriptRunConfig
    from batchyard.compat.azureml.core.workspace import Workspace

_LAZY = {
    "ComputeTarget": "batchyard.compat.azureml.core.compute",
    "CondaDependencies": "batchyard.compat.azureml.core.conda_dependencies",
    "Datastore": "batchyard.compat.azureml.core.datastore",
    "Environment": "batchyard.compat.azureml.core.environment",
    "Experiment": "batchyard.compat.azureml.core.experiment",
    "Run": "batchyard.compat.azureml.core.run",
    "RunConfiguration": "batchyard.compat.azureml.core.runconfig",
    "ScriptRunConfig": "batchyard.compat.azureml.core.script_run_config",
    "Workspace": "batchyard.compat.azureml.core.workspace",
}

__all__ = ["VERSION", "ComputeTarget", "CondaDependencies", "Datastore", "Environment",
           "Experiment", "Run", "RunConfiguration", "ScriptRunConfig", "Workspace"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'batchyard.compat.azureml.core' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
