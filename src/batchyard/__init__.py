"""batchyard: clusters and distributed training jobs on machines you own.

    import batchyard

    ws = batchyard.Workspace.get("default")
    job = ws.experiment("hello").submit("job.yaml", cluster="cpu2")   # a CLI job file
    job = ws.experiment("mnist").submit(batchyard.pytorch_job("train.py", nodes=2))
    for line in job.logs(follow=True):
        print(line, end="")

Inside a job: ``batchyard.log_metric("loss", 0.1, step=3)`` (and ``batchyard.flush()``
before ``os._exit``). The SDK's names (``batchyard.sdk``) are all here.

Kept import-light on purpose: the node launcher and rank processes import this package, and
every millisecond here is paid once per rank at job start. The SDK names load on first use.
"""

from __future__ import annotations

# Not `typing`'s TYPE_CHECKING: importing typing costs every CLI call ~1 ms (more than its
# whole fast path's budget share on a loaded machine); type checkers treat the name alike.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from batchyard.sdk import (
        Cluster,
        Experiment,
        Job,
        JobSpec,
        Run,
        Sweep,
        Workspace,
        checkpoint_saved,
        command_job,
        default_client,
        flush,
        heartbeat,
        load_job,
        log_list,
        log_metric,
        log_row,
        log_table,
        mpi_job,
        python_job,
        pytorch_job,
        set_default_client,
        should_checkpoint,
        tensorflow_job,
    )

__version__ = "0.1.0"

# Every public name of batchyard.sdk, loaded from there on first use.
__all__ = [
    "Cluster", "Experiment", "Job", "JobSpec", "Run", "Sweep", "Workspace", "__version__",
    "checkpoint_saved", "command_job", "default_client", "flush", "heartbeat", "load_job",
    "log_list", "log_metric", "log_row", "log_table", "mpi_job", "python_job", "pytorch_job",
    "set_default_client", "should_checkpoint", "tensorflow_job",
]
_SDK = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    if name not in _SDK:
        raise AttributeError(f"module 'batchyard' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("batchyard.sdk"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
