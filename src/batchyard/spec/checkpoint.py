"""The preemption notice's settings (``limits.checkpoint_signal``, ``limits.checkpoint_notice``):
a job is told before its SIGTERM so that it can save, and may say which signal it listens to."""

from __future__ import annotations

import signal
from typing import Any

DEFAULT_SIGNAL = "SIGUSR1"
NONE = "none"
# signals that end or stop the job (or that the launcher itself uses) make no notice
_REFUSED = {"SIGKILL", "SIGSTOP", "SIGTERM", "SIGCHLD", "SIGSEGV", "SIGBUS", "SIGFPE",
            "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS", "SIGCONT"}


def parse_signal(value: Any) -> str:
    """'SIGUSR1', 'USR1', 'sigusr2' or 'none' (no signal: the file and the SDK only)."""
    if value is None:
        return NONE
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a signal name such as SIGUSR1 or USR1, or 'none'")
    text = value.strip().upper()
    if text == "NONE":
        return NONE
    name = text if text.startswith("SIG") else f"SIG{text}"
    if name not in signal.Signals.__members__ or name in _REFUSED:
        raise ValueError(f"{value!r} is not a signal a job can be warned with; use a name "
                         "such as SIGUSR1, SIGUSR2, SIGINT or SIGHUP, or 'none'")
    return name


def signal_number(name: str) -> int | None:
    return None if name == NONE else int(signal.Signals[name])
