"""The node half of the hang watchdog (standard library only: the launcher runs under
``python -S``). It watches what this node's ranks do that shows progress: their log files
growing under the stdouterr dir and the heartbeat file the SDK touches
(``batchyard.heartbeat()``, ``log_metric``). It reports only whether this node has been idle
for the job's ``hang_timeout``; the server decides that the gang hangs when every node says
so (one node alone cannot know: its ranks may just wait for a slow peer).

Progress is a change seen in a file's (size, mtime), timed on this node's monotonic clock:
no mtime is compared with a clock, so a stdouterr dir on a mount with another clock, or a
skewed node, changes nothing."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchyard.node.plan import NodePlan

if TYPE_CHECKING:
    from batchyard.node.channel import Channel
    from batchyard.node.stacks import StackDumper

CHECK_EVERY = 1.0  # seconds between two looks at the files
UPLOAD_DEADLINE = 120.0  # how long a dump is retried while the server is away


def heartbeat_path(stdouterr: Path, node_name: str) -> Path:
    """Per node: several nodes may share one stdouterr dir (stdouterr_path_prefix on a
    shared mount). A dot name: the node channel ships it nowhere."""
    return stdouterr / f".heartbeat-{node_name}"


class Watchdog:
    def __init__(self, stdouterr: Path, node_name: str, timeout: float,
                 every: float = CHECK_EVERY) -> None:
        self.dir = stdouterr
        self.timeout = timeout
        self.every = min(every, max(timeout / 4, 0.1))
        # a rank's own logs and the heartbeat; not the launcher's or the preparation's logs
        # (the launcher writes its own lines when it dumps: that is no progress of the job)
        self._mine = re.compile(rf"^{re.escape(node_name)}-(rank\d+|mpirun)\.std(out|err)\.txt$"
                                rf"|^{re.escape(heartbeat_path(stdouterr, node_name).name)}$")
        self._seen: dict[str, tuple[int, int]] = {}
        self.last_progress = time.monotonic()
        self._looked = 0.0
        self.idle = False

    def _signature(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        try:
            with os.scandir(self.dir) as entries:
                for entry in entries:
                    if self._mine.match(entry.name):
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        found[entry.name] = (st.st_size, st.st_mtime_ns)
        except OSError:
            pass
        return found

    def idle_for(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.last_progress

    def tick(self, now: float | None = None) -> bool | None:
        """Look (at most every ``every`` s); the new idle state when it changed, else
        None."""
        now = time.monotonic() if now is None else now
        if now - self._looked < self.every:
            return None
        self._looked = now
        current = self._signature()
        if current != self._seen:
            self._seen = current
            self.last_progress = now
        idle = now - self.last_progress >= self.timeout
        if idle == self.idle:
            return None
        self.idle = idle
        return idle


class HangWatch:
    """The launcher's share (a mixin of node.launcher.Launcher): report this node's idleness
    as it changes, and take the stack dumps the server asks for."""

    plan: NodePlan
    channel: Channel | None
    _hang_watch: Watchdog | None = None
    _dumper: StackDumper | None = None

    def say(self, message: str) -> None:  # the launcher's
        raise NotImplementedError

    def write_status(self, **changes: Any) -> None:  # the launcher's
        raise NotImplementedError

    def start_watch(self, stdouterr: Path) -> None:
        """When the ranks start: the job's hang_timeout counts from here."""
        if self.plan.hang_timeout:
            self._hang_watch = Watchdog(stdouterr, self.plan.node_name,
                                        float(self.plan.hang_timeout))

    def watch_tick(self) -> None:
        watch = self._hang_watch
        if watch is None:
            return
        idle = watch.tick()
        if idle is not None:
            if idle:
                self.say(f"no progress of this node's ranks for {watch.timeout:g}s")
            self.write_status(idle=idle)

    def stacks_requested(self, requests: list[dict[str, Any]]) -> None:
        channel = self.channel
        if channel is None:
            return
        if self._dumper is None:
            from batchyard.node.stacks import StackDumper

            def send(dump: dict[str, Any]) -> None:
                channel.retrying("POST", "/stacks", {"id": dump["id"], "dump": dump},
                                 deadline=time.time() + UPLOAD_DEADLINE, timeout=60.0)

            self._dumper = StackDumper(self.plan.tag, self.plan.node_rank, self.plan.node_name,
                                       send, self.say,
                                       in_container=bool(getattr(self, "boxed", False)))
        self._dumper.requested(requests)
