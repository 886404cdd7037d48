"""azureml.core.compute_target: where seed-era code imported ComputeTargetException from."""

from __future__ import annotations

from batchyard.compat.azureml.core.compute.compute import ComputeTarget
from batchyard.compat.azureml.exceptions import ComputeTargetException

__all__ = ["ComputeTarget", "ComputeTargetException"]
