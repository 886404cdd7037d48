"""train.py with Azure ML-style metrics: the same DDP training, and rank 0 logs the test
accuracy with ``Run.get_context().log`` (from ``batchyard.compat.azureml``; outside a job the
run is offline and prints it). Metrics are sent by a background thread; since this script
leaves with ``os._exit`` (gloo's SIGABRT workaround, DESIGN §7), which skips exit handlers,
it flushes them explicitly first.

    batchyard job create -f job.yaml    # with `command: python train_aml.py`
    batchyard job metrics -n <job>
"""

from __future__ import annotations

import os
import sys
import traceback

import torch.distributed as dist
import train

from batchyard.compat.azureml.core.run import Run

run = Run.get_context()
_evaluate = train.evaluate


def evaluate_and_log(*args, **kwargs) -> float:  # type: ignore[no-untyped-def]
    accuracy = _evaluate(*args, **kwargs)  # every rank gets the gang's accuracy
    if int(os.environ.get("RANK", "0")) == 0:
        run.log("accuracy", accuracy)
    return accuracy


train.evaluate = evaluate_and_log


def main() -> None:
    try:
        code = train.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BaseException:
        traceback.print_exc()
        code = 1
    run.flush()  # before os._exit, which skips the flush at exit
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
