"""azureml.telemetry.set_diagnostics_collection: batchyard sends nothing anywhere — no
telemetry, no diagnostics. The call is accepted so notebooks run unchanged, and only records
the choice in this process (see :func:`get_diagnostics_collection_info`)."""

from __future__ import annotations

from typing import Any

_choice: dict[str, Any] = {"send_diagnostics": False, "set": False}


def set_diagnostics_collection(send_diagnostics: bool = True, verbose: bool = True,
                               reset: bool = False, path: str | None = None) -> None:
    """Record the choice and do nothing else: batchyard collects and sends no diagnostics,
    whatever ``send_diagnostics`` says."""
    _choice.update(send_diagnostics=bool(send_diagnostics), set=not reset)
    if verbose:
        print("batchyard sends no diagnostics anywhere; recorded "
              f"send_diagnostics={bool(send_diagnostics)} and nothing else.")


def get_diagnostics_collection_info(component_name: str | None = None,
                                    path: str | None = None) -> dict[str, Any]:
    return dict(_choice)


__all__ = ["get_diagnostics_collection_info", "set_diagnostics_collection"]
