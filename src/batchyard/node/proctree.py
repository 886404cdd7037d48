"""Finding and killing every process of a node's attempt, including daemonised grandchildren.

Three nets, because each alone has holes: process groups (ranks start in their own session),
the launcher as child subreaper (orphans re-parent to it), and a tag in the environment of
every process it starts (found by scanning /proc, which also works after the launcher died).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterable

from batchyard.node.pidns import forwarded

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
# pids a launcher's own kills pass over until it lets them go: its FUSE mounts' rclone, which
# must outlive the ranks to flush what they wrote (node/fuse.py unmounts it last)
spared: set[int] = set()
forwarders: dict[int, int] = {}  # a reaped forwarder's pid -> its child's (node/pidns.py)


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent() -> None:
    """preexec_fn for ranks: if the launcher is SIGKILLed, the kernel kills its ranks."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def tagged_pids(tag: str) -> list[int]:
    """PIDs whose environment carries ``BATCHYARD_PROC_TAG=<tag>`` (exact match)."""
    needle = f"BATCHYARD_PROC_TAG={tag}\0".encode()
    me = os.getpid()
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if needle in data + b"\0":
            found.append(pid)
    return found


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    state = stat[stat.rindex(b")") + 2 :].split()[0]
    return state not in (b"Z", b"X")


def signal_all(pids: Iterable[int], sig: int, groups: Iterable[int] = ()) -> None:
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def kill_everything(tag: str, groups: Iterable[int] = (), grace: float = 0.0,
                    reap: bool = False, own_children: bool = True) -> int:
    """SIGTERM, wait up to ``grace``, then SIGKILL whatever carries the tag; returns how many
    processes were still there for the SIGKILL. A launcher owns its descendants and kills
    them too; a sweeper (the server, an agent) passes ``own_children=False``, or it would kill
    its other launchers with them."""
    groups = list(groups)

    def mine() -> set[int]:
        return set(descendants(os.getpid())) - spared if own_children else set()

    keep = spared if own_children else set()
    pids = (set(tagged_pids(tag)) - keep) | mine()
    if not pids and not groups:
        return 0
    signal_all(pids, signal.SIGTERM, groups)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if reap:
            reap_children()
        pids = {p for p in pids | (set(tagged_pids(tag)) - keep) if alive(p)}
        if not pids:
            break
        time.sleep(0.05)
    # Each scan is a snapshot: a process forking as the SIGKILL goes out leaves a child the
    # scan never saw (a Hydra proxy or an exec spawner answering SIGTERM), so look again
    # until a scan finds nothing alive.
    killed: set[int] = set()
    end = time.monotonic() + 2
    while True:
        survivors = {p for p in (set(tagged_pids(tag)) - keep) | mine() if alive(p)}
        if not survivors or time.monotonic() >= end:
            break
        killed |= survivors
        signal_all(survivors, signal.SIGKILL, groups)
        if reap:
            reap_children()
        time.sleep(0.02)
    if reap:
        reap_children()
    return len(killed)


def reap_children() -> list[tuple[int, int]]:
    """Collect every exited child (ours or adopted); returns (pid, raw wait status). A rank
    sandbox's forwarder (node/pidns.py) is looked at before, for the pid of the job process
    it stood for (``forwarders``)."""
    reaped: list[tuple[int, int]] = []
    for _ in range(1 << 16):
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if info is None:
            break
        child = forwarded(info.si_pid)  # (a zombie keeps its name)
        try:
            pid, status = os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            continue  # another thread reaped it meanwhile
        if pid == 0:
            continue
        if child is not None:
            forwarders[pid] = child
            while len(forwarders) > 4096:
                forwarders.pop(next(iter(forwarders)))
        reaped.append((pid, status))
    return reaped


def exit_code(status: int) -> int:
    """Shell convention: a signal death is 128 + signal number."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def start_time(pid: int) -> float | None:
    """The process's start time in clock ticks since boot: with the pid, it tells a live
    process from a later one that reused its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return float(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None
