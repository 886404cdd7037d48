"""Small shared pieces of the azureml compat layer: status names, times, errors."""

from __future__ import annotations

import datetime as dt
from typing import Any

from batchyard.compat.azureml.exceptions import UnsupportedParameterError

# batchyard job state -> Azure ML run status
STATUS = {"queued": "Queued", "preparing": "Preparing", "running": "Running",
          "finalizing": "Finalizing", "succeeded": "Completed", "failed": "Failed",
          "canceled": "Canceled"}
TERMINAL_STATUS = ("Completed", "Failed", "Canceled")


def aml_status(state: str | None) -> str:
    return STATUS.get(state or "", "NotStarted")


def iso(ts: float | None) -> str | None:
    """Seconds since the epoch as Azure ML wrote times: ``2018-12-10T08:51:24.123456Z``."""
    if ts is None:
        return None
    stamp = dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def refuse(where: str, reason: str, **given: Any) -> None:
    """Raise for every parameter in ``given`` that was set (not None/False/empty)."""
    named = [name for name, value in given.items() if value not in (None, False, "", [], {})]
    if named:
        raise UnsupportedParameterError(named, reason, where)
