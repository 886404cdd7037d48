"""The launcher's limits on a job's node (issue 32): the number of its processes (its
cgroup's ``pids.max``, node/cgroups.py) and the size of its outputs (``limits.max_output``),
watched while it runs and enforced again by the upload, which never follows a link out of an
output folder (node/outguard.py) and names what it skipped. Reaching a limit ends the job's
processes and fails it with its cause; the node and the server go on."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from batchyard.node import failure, proctree
from batchyard.node.env import NodeDirs
from batchyard.node.plan import AttemptPaths, NodePlan, write_json_atomic

if TYPE_CHECKING:
    from batchyard.node.channel import Channel
    from batchyard.node.sandbox import Sandbox

START_DEADLINE = 600.0


class PathRefused(Exception):
    """A path the job names reaches a folder no job may (batchyard/pathguard.py)."""


class Limits:
    """Mixed into the Launcher, which provides these attributes and methods."""

    plan: NodePlan
    paths: AttemptPaths
    channel: Channel | None
    sandbox: Sandbox | None

    def say(self, message: str) -> None:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _groups(self) -> list[int]:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    _limits_at = 0.0
    _outputs_at = 0.0

    def _over_limit(self, dirs: NodeDirs, now: bool = False
                    ) -> tuple[str, dict[str, Any]] | None:
        """The job's limits on this node, looked at twice a second (its outputs' size less
        often when measuring them takes long), or ``now``: past one, its processes end and
        it fails."""
        at = time.monotonic()
        if not now and at - self._limits_at < 0.5:
            return None
        self._limits_at = at
        plan, name = self.plan, self.plan.node_name
        cause = summary = None
        if self.sandbox is not None and self.sandbox.cgroup.refused():
            cause, summary = failure.PIDS_LIMIT, (
                f"the job reached its limit of {self.sandbox.cgroup.limit} processes on node "
                f"{name} (limits.max_pids, or the cluster's max_pids)")
        elif plan.max_output and (now or at >= self._outputs_at):
            from batchyard.node.outguard import size
            from batchyard.spec.bytesize import human

            used = 0
            for ident, path in dirs.outputs.items():
                if not plan.outputs.get(ident, {}).get("fuse"):
                    used += size(str(path), plan.max_output - used)
            self._outputs_at = at + max(1.0, 10 * (time.monotonic() - at))
            if used > plan.max_output:
                cause, summary = failure.OUTPUT_LIMIT, (
                    f"the job's outputs on node {name} passed its limit of "
                    f"{human(plan.max_output)} (limits.max_output)")
        if cause is None or summary is None:
            return None
        self.say(summary)
        if not self.paths.abort.exists():
            write_json_atomic(self.paths.abort, {"node": name, "node_rank": plan.node_rank,
                                                 "message": summary})
        proctree.kill_everything(plan.tag, self._groups(), grace=0.0, reap=True)
        return "failed", {"message": summary, "error": failure.record(
            cause, node=name, node_rank=plan.node_rank, summary=summary, what="node")}

    def _upload_outputs(self, dirs: NodeDirs, state: str,
                        extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Outputs without a datastore of their own go to the workspace datastore on the
        server, whatever way the ranks ended (what a failed job wrote survives)."""
        if self.channel is None:
            return state, extra
        local = {ident: path for ident, path in dirs.outputs.items()
                 if not self.plan.outputs.get(ident, {}).get("store")}
        if not local:
            return state, extra
        try:
            done = self.channel.upload_outputs(local, time.time() + START_DEADLINE,
                                               self.plan.max_output)
        except Exception as exc:
            self.say(f"uploading outputs failed: {exc}")
            if state == "succeeded":
                return "failed", {"message": f"on node {self.plan.node_name}: uploading "
                                  f"outputs failed: {exc}"}
            return state, extra
        for line in done.skipped:
            self.say(f"not uploaded: {line}")
        if done.count:
            self.say(f"uploaded {done.count} output file(s), {done.size} bytes")
        if done.over and state == "succeeded":
            from batchyard.spec.bytesize import human

            limit = human(self.plan.max_output or 0)
            summary = (f"the job's outputs on node {self.plan.node_name} passed its limit of "
                       f"{limit} (limits.max_output): only {done.size} bytes uploaded")
            return "failed", {"message": summary, "error": failure.record(
                failure.OUTPUT_LIMIT, node=self.plan.node_name,
                node_rank=self.plan.node_rank, summary=summary, what="node")}
        return state, extra

