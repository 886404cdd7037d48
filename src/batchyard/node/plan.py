"""Where one attempt's node-local control files live (under the node's own attempt dir; the
server never reads them: it learns everything over the node channel)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from batchyard.launchplan import NodePlan, read_json, write_json_atomic

__all__ = ["AttemptPaths", "NodePlan", "open_append", "read_json", "write_json_atomic"]


@dataclass(frozen=True)
class AttemptPaths:
    root: Path

    @property
    def control(self) -> Path:
        return self.root / ".batchyard"

    def plan(self, node_rank: int) -> Path:
        return self.control / f"node-{node_rank}.plan.json"

    def status(self, node_rank: int) -> Path:
        return self.control / f"node-{node_rank}.status.json"

    def started(self, node_rank: int) -> Path:
        return self.control / f"node-{node_rank}.started"

    @property
    def cancel(self) -> Path:
        return self.control / "cancel.json"

    @property
    def abort(self) -> Path:
        return self.control / "abort.json"

    @property
    def finish(self) -> Path:
        return self.control / "finish"

    @property
    def stdouterr(self) -> Path:
        return self.root / "stdouterr"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"


def open_append(path: Path, folder_fd: int | None = None) -> int:
    """``path`` opened for appending by the launcher, in a folder a job may write to: never
    through a link planted there (``O_NOFOLLOW``), and, given ``folder_fd`` (the folder,
    opened before any job process ran), relative to that folder whatever became of its
    path."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    if folder_fd is not None:
        return os.open(path.name, flags, 0o644, dir_fd=folder_fd)
    return os.open(path, flags, 0o644)
