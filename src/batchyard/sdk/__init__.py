"""The batchyard Python SDK: workspaces, clusters, experiments, jobs and metrics, over the
same HTTP client as the CLI (a local server is started on demand). Every name here is also
``batchyard.NAME``.

    import batchyard

    ws = batchyard.Workspace.get("default")
    ws.create_cluster("cpu2", vm_size="Standard_D2_v2", nodes=2, exist_ok=True)
    job = ws.experiment("mnist").submit(
        batchyard.pytorch_job("train.py", nodes=2, processes_per_node=2,
                              code="examples/mnist-ddp"), cluster="cpu2")
    job.wait(show_output=True)
    print(job.latest_metrics())

    job = ws.experiment("hello").submit("examples/hello-distributed/job.yaml")
    for line in job.logs(follow=True):
        print(line, end="")

Inside a job, ``batchyard.log_metric(name, value, step)`` records metrics (batched in the
background, never blocking training).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchyard.sdk._client import default_client, set_default_client
    from batchyard.sdk.builders import (
        command_job,
        load_job,
        mpi_job,
        python_job,
        pytorch_job,
        tensorflow_job,
    )
    from batchyard.sdk.checkpoint import checkpoint_saved, should_checkpoint
    from batchyard.sdk.cluster import Cluster
    from batchyard.sdk.experiment import Experiment
    from batchyard.sdk.job import Job, Run
    from batchyard.sdk.metrics import flush, heartbeat, log_list, log_metric, log_row, log_table
    from batchyard.sdk.sweep import Sweep
    from batchyard.sdk.workspace import Workspace
    from batchyard.spec.job import JobSpec

# Loaded on first use: a rank that only logs metrics must not pay for the whole SDK.
_LAZY = {
    "default_client": "batchyard.sdk._client", "set_default_client": "batchyard.sdk._client",
    "command_job": "batchyard.sdk.builders", "mpi_job": "batchyard.sdk.builders",
    "python_job": "batchyard.sdk.builders", "pytorch_job": "batchyard.sdk.builders",
    "tensorflow_job": "batchyard.sdk.builders", "load_job": "batchyard.sdk.builders",
    "Cluster": "batchyard.sdk.cluster",
    "Experiment": "batchyard.sdk.experiment", "Job": "batchyard.sdk.job",
    "Run": "batchyard.sdk.job", "Workspace": "batchyard.sdk.workspace",
    "Sweep": "batchyard.sdk.sweep",
    "JobSpec": "batchyard.spec.job", "flush": "batchyard.sdk.metrics",
    "heartbeat": "batchyard.sdk.metrics",
    "checkpoint_saved": "batchyard.sdk.checkpoint",
    "should_checkpoint": "batchyard.sdk.checkpoint",
    "log_list": "batchyard.sdk.metrics", "log_metric": "batchyard.sdk.metrics",
    "log_row": "batchyard.sdk.metrics", "log_table": "batchyard.sdk.metrics",
}

__all__ = [
    "Cluster", "Experiment", "Job", "JobSpec", "Run", "Sweep", "Workspace", "checkpoint_saved",
    "command_job", "default_client", "flush", "heartbeat", "load_job", "log_list", "log_metric",
    "log_row", "log_table", "mpi_job", "python_job", "pytorch_job", "set_default_client",
    "should_checkpoint", "tensorflow_job",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'batchyard.sdk' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
