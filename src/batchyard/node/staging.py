"""The node launcher's storage steps (stdlib only, like the launcher): stage-in before the
job preparation, a periodic output sync while the ranks run, stage-out after they end. The
transfers themselves run in a subprocess with the full interpreter
(``python -m batchyard.storage.stage``), since the launcher runs with ``-S`` and cannot import
fsspec; that subprocess reads the credentials from the plan file (mode 0600), gets none in its
environment, and its logs go to the node's ``stdouterr/<node>-stage<in|out|sync>.*.txt``
(shipped to the server like every other log)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from batchyard.node import proctree
from batchyard.node.env import NodeDirs, node_dirs
from batchyard.node.plan import AttemptPaths, NodePlan, read_json

POLL = 0.05


class Staging:
    """Mixed into the Launcher, which provides these attributes and methods."""

    plan: NodePlan
    paths: AttemptPaths
    ranks: dict[int, dict[str, Any]]

    def say(self, message: str) -> None:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: Path, out: Path,
               err: Path) -> subprocess.Popen[bytes]:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _stop_reason(self) -> dict[str, Any] | None:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _stop(self, stop: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _reap(self) -> list[tuple[int, int]]:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _pause(self) -> None:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _has_storage(self) -> bool:
        plan = self.plan
        return any(x.get("store") for x in (*plan.mounts, *plan.inputs.values(),
                                            *plan.outputs.values()))

    def _stage_proc(self, what: str, *extra: str) -> subprocess.Popen[bytes]:
        src_root = str(Path(__file__).resolve().parents[2])
        argv = [sys.executable, "-m", "batchyard.storage.stage", what,
                str(self.paths.plan(self.plan.node_rank)), *extra]
        logs = node_dirs(self.plan).stdouterr  # with every other log: shipped to the server
        name = f"{self.plan.node_name}-stage{what}"
        return self._spawn(argv, {"PYTHONPATH": src_root}, logs,
                           logs / f"{name}.stdout.txt", logs / f"{name}.stderr.txt")

    def _stage_result(self, what: str) -> dict[str, Any]:
        control = self.paths.control
        return read_json(control / f"node-{self.plan.node_rank}.stage-{what}.json") or {}

    def _stage_in(self, dirs: NodeDirs) -> tuple[str, dict[str, Any]]:
        """Mount volumes backed by storage and download-mode inputs, before preparation."""
        if not self._has_storage():
            return "ready", {}
        self.say("stage-in: downloading storage mounts and inputs")
        state, extra = self._wait_step("stage-in", self._stage_proc("in"), stoppable=True)
        result = self._stage_result("in")
        for note in result.get("notes") or []:
            self.say(note)
        if state == "failed":
            extra["message"] = (f"on node {self.plan.node_name}: " + result["message"]
                                if result.get("message") else extra["message"])
        return state, extra

    def _start_sync(self) -> subprocess.Popen[bytes] | None:
        every = self.plan.storage_sync
        writable = any(o.get("store") for o in self.plan.outputs.values()) or any(
            m.get("store") and not m.get("read_only") for m in self.plan.mounts)
        if not every or not writable:
            return None
        self.say(f"outputs are synced to storage every {every:g}s")
        return self._stage_proc("sync", "--every", str(every))

    def _stage_out(self, state: str, extra: dict[str, Any],
                   sync: subprocess.Popen[bytes] | None) -> tuple[str, dict[str, Any]]:
        """Upload outputs and write back mounts whatever way the ranks ended (what a failed or
        preempted job wrote survives)."""
        if sync is not None:
            sync.terminate()
            self._wait_step("sync", sync, stoppable=False, limit=30.0)
        if not self._has_storage():
            return state, extra
        self.say("stage-out: uploading outputs and mounts")
        limit = self.plan.grace_period + 60.0 if state != "succeeded" else None
        step, info = self._wait_step("stage-out", self._stage_proc("out"), stoppable=False,
                                     limit=limit)
        if step != "ready":
            message = self._stage_result("out").get("message") or info.get("message", "")
            self.say(message)
            if state == "succeeded":
                return "failed", {"message": f"on node {self.plan.node_name}: {message}"}
        return state, extra

    def _wait_step(self, what: str, proc: subprocess.Popen[bytes], *, stoppable: bool,
                   limit: float | None = None) -> tuple[str, dict[str, Any]]:
        self.ranks[-1] = {"rank": -1, "what": what, "pid": proc.pid, "exit_code": None}
        deadline = time.time() + limit if limit is not None else None
        try:
            while True:
                stop = self._stop_reason() if stoppable else None
                if stop:
                    return self._stop(stop)
                if deadline is not None and time.time() > deadline:
                    proctree.kill_everything(self.plan.tag, [proc.pid], grace=1.0, reap=True)
                    return "failed", {"message": f"{what} did not finish in {limit:g}s"}
                for pid, status in self._reap():
                    if pid == proc.pid:
                        code = proctree.exit_code(status)
                        proc.returncode = code
                        if code != 0:
                            return "failed", {"exit_code": code, "message":
                                              f"{what} on node {self.plan.node_name} exited "
                                              f"with code {code}"}
                        return "ready", {}
                self._pause()
        finally:
            self.ranks.pop(-1, None)
