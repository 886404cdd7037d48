"""The command line that runs TensorBoard as a child that dies with its parent (the
``batchyard job tensorboard`` command, or the server for the portal): a short Python prelude
sets the parent-death signal (Linux keeps it across exec), checks the parent is still there,
then becomes ``python -m tensorboard.main ARGS``. Standard library only."""

from __future__ import annotations

import os
import sys

_PRELUDE = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
            "os.getppid() == int(sys.argv[1]) or os._exit(1); "
            "os.execv(sys.executable, [sys.executable, '-m', 'tensorboard.main', "
            "*sys.argv[2:]])")


def argv(args: list[str]) -> list[str]:
    """Start it from a thread that lives as long as the parent: the signal follows the
    thread that forked the child."""
    return [sys.executable, "-c", _PRELUDE, str(os.getpid()), *args]
