"""Where one attempt's node-local control files live (under the node's own attempt dir; the
server never reads them: it learns everything over the node channel)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batchyard.launchplan import NodePlan, read_json, write_json_atomic

__all__ = ["AttemptPaths", "NodePlan", "read_json", "write_json_atomic"]


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
