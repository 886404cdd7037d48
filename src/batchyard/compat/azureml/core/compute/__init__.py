"""azureml.core.compute: compute targets are batchyard clusters."""

from __future__ import annotations

from batchyard.compat.azureml.core.compute.amlcompute import (
    AmlCompute,
    AmlComputeProvisioningConfiguration,
    AmlComputeStatus,
)
from batchyard.compat.azureml.core.compute.compute import ComputeTarget

__all__ = ["AmlCompute", "AmlComputeProvisioningConfiguration", "AmlComputeStatus",
           "ComputeTarget"]
