"""azureml.widgets: ``RunDetails(run).show()``."""

from __future__ import annotations

from batchyard.compat.azureml.widgets.run_details import RunDetails

__all__ = ["RunDetails"]
