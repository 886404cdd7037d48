"""A running job's TensorBoard files sent to the server while it runs (standard library
only): every ``every`` seconds, the event files (``*tfevents*``) and TensorBoard's plugin
folders of the outputs that go to the server are uploaded when they changed, so ``batchyard
job tensorboard`` shows a run as it trains. The final upload at the end sends everything."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import urllib.parse
from pathlib import Path
from typing import Any

EVERY = 30.0
MAX_FILE = 256 * 1024 * 1024  # an event file larger than this waits for the final upload


def is_tensorboard_file(rel: str) -> bool:
    parts = rel.split("/")
    return "tfevents" in parts[-1] or "plugins" in parts[:-1] or parts[-1] == \
        "projector_config.pbtxt"


class EventSync:
    def __init__(self, channel: Any, outputs: dict[str, Path], every: float = EVERY) -> None:
        self.channel = channel
        self.outputs = outputs
        self.every = max(0.2, every)
        self.sent: dict[str, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-sync", daemon=True)

    def start(self) -> EventSync:
        if self.outputs:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            with contextlib.suppress(Exception):  # the next round tries again
                self.once()

    def once(self) -> int:
        count = 0
        for ident, root in self.outputs.items():
            if not root.is_dir():
                continue
            for current, _dirs, names in os.walk(root):
                for name in names:
                    path = Path(current) / name
                    rel = path.relative_to(root).as_posix()
                    if not is_tensorboard_file(rel) or self._stop.is_set():
                        continue
                    try:
                        st = path.lstat()
                    except OSError:
                        continue
                    key = f"{ident}/{rel}"
                    mark = (st.st_size, st.st_mtime_ns)
                    if not path.is_file() or path.is_symlink() or st.st_size > MAX_FILE \
                            or self.sent.get(key) == mark:
                        continue
                    data = path.read_bytes()
                    self.channel.call("PUT", f"/outputs/{urllib.parse.quote(key)}", raw=data,
                                      headers={"X-Content-Sha256":
                                               hashlib.sha256(data).hexdigest(),
                                               "Content-Type": "application/octet-stream"},
                                      timeout=120.0)
                    self.sent[key] = mark
                    count += 1
        return count


def start(channel: Any, plan: Any, outputs: dict[str, Path]) -> EventSync:
    """The sync of the outputs that go to the server (none without a node channel)."""
    local = {ident: path for ident, path in outputs.items()
             if not plan.outputs.get(ident, {}).get("store")} if channel is not None else {}
    every = float((plan.observe or {}).get("event_sync") or EVERY)
    return EventSync(channel, local, every).start()
