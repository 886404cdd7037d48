"""The node launcher's storage steps (stdlib only, like the launcher): stage-in before the
job preparation, a periodic output sync while the ranks run, stage-out after they end. The
transfers themselves run in a subprocess with the full interpreter
(``python -m batchyard.storage.stage``), since the launcher runs with ``-S`` and cannot import
fsspec; that subprocess reads the credentials from the plan file (mode 0600), gets none in its
environment, and its logs go to the node's ``stdouterr/<node>-stage<in|out|sync>.*.txt``
(shipped to the server like every other log).

Mounts (``ro_mount`` inputs, ``rw_mount`` outputs, Batch AI blob volumes) are FUSE mounts
made here with rclone (node/fuse.py) once the stage process has checked that the storage is
there and the credentials work; NFS file servers are mounted with the kernel's client
(node/nfs.py). Where a mount cannot be made the item is copied instead, and the reason is
said in the node's ``<node>-mount.stdout.txt``, which ``job logs`` shows. Every mount is
undone on every way out of the launcher (``_unmount_all``), rw mounts flushed first."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from batchyard.node import fuse, nfs, proctree
from batchyard.node.env import NodeDirs, node_dirs
from batchyard.node.plan import AttemptPaths, NodePlan, read_json

POLL = 0.05


class Staging:
    """Mixed into the Launcher, which provides these attributes and methods."""

    plan: NodePlan
    paths: AttemptPaths
    ranks: dict[int, dict[str, Any]]
    _popens: list[subprocess.Popen[bytes]]

    def say(self, message: str) -> None:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: Path, out: Path,
               err: Path, inside: bool = False,
               stdin_data: bytes | None = None) -> subprocess.Popen[bytes]:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _stop_reason(self) -> dict[str, Any] | None:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _stop(self, stop: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _reap(self) -> list[tuple[int, int]]:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def append(self, path: Path) -> Any:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def job_uid(self) -> int | None:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _give(self, path: Path) -> None:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _pause(self) -> None:
        raise RuntimeError("provided by the Launcher")  # pragma: no cover

    def _has_storage(self, copied: bool = False) -> bool:
        """``copied``: only what is copied back at the end (not mounted, not read-only)."""
        plan = self.plan
        if copied:
            return any(x.get("store") and not x.get("fuse") and not x.get("read_only")
                       for x in (*plan.mounts, *plan.outputs.values()))
        return any(x.get("store") for x in (*plan.mounts, *plan.inputs.values(),
                                            *plan.outputs.values()))

    def _stage_proc(self, what: str, *extra: str) -> subprocess.Popen[bytes]:
        src_root = str(Path(__file__).resolve().parents[2])
        # the plan with its storage credentials comes on stdin: the file copy is masked
        argv = [sys.executable, "-m", "batchyard.storage.stage", what,
                str(self.paths.plan(self.plan.node_rank)), "--plan-on-stdin", *extra]
        logs = node_dirs(self.plan).stdouterr  # with every other log: shipped to the server
        name = f"{self.plan.node_name}-stage{what}"
        return self._spawn(argv, {"PYTHONPATH": src_root}, logs,
                           logs / f"{name}.stdout.txt", logs / f"{name}.stderr.txt",
                           stdin_data=json.dumps(self.plan.to_dict()).encode())

    def _stage_result(self, what: str) -> dict[str, Any]:
        control = self.paths.control
        return read_json(control / f"node-{self.plan.node_rank}.stage-{what}.json") or {}

    def _stage_in(self, dirs: NodeDirs) -> tuple[str, dict[str, Any]]:
        """Mount volumes backed by storage and download-mode inputs, before preparation."""
        self._choose_mounts(dirs)
        if not self._has_storage():
            return self._mount_all(dirs)
        self.say("stage-in: checking storage, downloading inputs and copied mounts")
        state, extra = self._wait_step("stage-in", self._stage_proc("in"), stoppable=True)
        result = self._stage_result("in")
        for note in result.get("notes") or []:
            self.say(note)
        if state == "failed":
            extra["message"] = (f"on node {self.plan.node_name}: " + result["message"]
                                if result.get("message") else extra["message"])
        if state != "ready":
            return state, extra
        state, extra = self._mount_all(dirs)
        for mount in self.plan.mounts:  # copied: the job's to write in, as a mount would be
            if mount.get("store") and not mount.get("fuse") and not mount.get("read_only"):
                self._give(dirs.job_mount_root / mount["relative_path"])
        for path in dirs.outputs.values():  # (made again under those)
            self._give(path)
        return state, extra

    def _fuse_items(self, dirs: NodeDirs) -> list[tuple[str, dict[str, Any], Path, bool]]:
        """(label, plan item, mount point, read-only) of everything that is a mount."""
        plan = self.plan
        items = [(f"mount {m['relative_path']}", m, dirs.job_mount_root / m["relative_path"],
                  bool(m.get("read_only"))) for m in plan.mounts if m.get("store")]
        items += [(f"input {i}", x, Path(dirs.inputs[i]), True) for i, x in plan.inputs.items()
                  if x.get("store") and x.get("mode") == "ro_mount"]
        items += [(f"output {i}", x, dirs.outputs[i], False) for i, x in plan.outputs.items()
                  if x.get("store") and x.get("mode") == "rw_mount"]
        return items

    def _mount_note(self, dirs: NodeDirs, text: str) -> None:
        """A line for ``job logs`` (the node's mount log) and the launcher's own log."""
        self.say(text)
        with self.append(dirs.stdouterr / f"{self.plan.node_name}-mount.stdout.txt") as fh:
            fh.write(f"{time.strftime('%H:%M:%S')} {text}\n".encode())

    def _choose_mounts(self, dirs: NodeDirs) -> None:
        """Mark what rclone will mount (``fuse`` on the plan item, so the stage process only
        checks it); whatever cannot be is copied, and the reason said."""
        self._fuse_mounts: list[fuse.Mount] = []
        self._nfs_mounts: list[Path] = []
        items = self._fuse_items(dirs)
        if not items:
            return
        why_not = fuse.unavailable()
        if why_not is None:
            fuse.sweep_orphans()
        for label, item, target, read_only in items:
            why = why_not or fuse.not_mountable(item["store"])
            if why is None and (dirs.stdouterr == target or target in dirs.stdouterr.parents):
                why = "it holds the job's log directory (stdOutErrPathPrefix)"
            item["fuse"] = why is None
            if why is not None:
                copy = ("falling back to download" if read_only or label.startswith("mount")
                        else "falling back to upload at the end (and periodic syncs)")
                mode = item.get("mode") or "mount"
                self._mount_note(dirs, f"{label}: {mode}: no FUSE mount ({why}); {copy}")
        self.plan.save(self.paths.plan(self.plan.node_rank), mask_registry=True)

    def _mount_all(self, dirs: NodeDirs) -> tuple[str, dict[str, Any]]:
        expiry = time.time() + (self.plan.max_wall_clock or 0.0) + 7 * 86400.0
        try:
            for index, (label, item, target, read_only) in enumerate(self._fuse_items(dirs)):
                if not item.get("fuse"):
                    continue
                made = fuse.mount(label, item["store"], target, read_only=read_only,
                                  tag=self.plan.tag, index=index, control=self.paths.control,
                                  cache_root=Path(self.plan.node_dir) / "cache",
                                  expiry=expiry, started=lambda p: proctree.spared.add(p.pid),
                                  uid=self.job_uid())
                self._popens.append(made.proc)
                self._fuse_mounts.append(made)
                self._mount_note(dirs, f"{label}: FUSE mount (rclone, "
                                 f"{'read-only' if read_only else 'read-write'}) at {target}")
            for mount in self.plan.mounts:
                if mount.get("kind") == "file_server":
                    target = dirs.job_mount_root / mount["relative_path"]
                    label = f"mount {mount['relative_path']} (fileServer {mount['source']})"
                    nfs.mount(label, str(mount["source"]), target, mount.get("mount_options"))
                    self._nfs_mounts.append(target)
                    self._mount_note(dirs, f"{label}: NFS mount at {target}")
        except (fuse.MountError, RuntimeError, OSError) as exc:
            self._mount_note(dirs, str(exc))
            return "failed", {"message": f"on node {self.plan.node_name}: {exc}"}
        for path in dirs.outputs.values():  # those under a mount point are hidden by it
            path.mkdir(parents=True, exist_ok=True)
        return "ready", {}

    def _flush_mounts(self, state: str, extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Wait until what the ranks wrote to rw mounts is in storage; a flush that fails
        fails a job that had succeeded."""
        limit = fuse.FLUSH_WAIT if state == "succeeded" else self.plan.grace_period + 60.0
        for made in getattr(self, "_fuse_mounts", []):
            try:
                made.flush(limit)
            except fuse.MountError as exc:
                self._mount_note(node_dirs(self.plan), str(exc))
                if state == "succeeded":
                    state, extra = "failed", {"message": f"on node {self.plan.node_name}: "
                                              f"{exc}"}
        return state, extra

    def _unmount_all(self, state: str, extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Undo every mount, rw mounts flushed again first (what stragglers killed at the end
        wrote); the launcher's last step, whatever way it ends."""
        state, extra = self._flush_mounts(state, extra)
        mounts: list[fuse.Mount] = getattr(self, "_fuse_mounts", [])
        for made in reversed(mounts):
            made.unmount()
            proctree.spared.discard(made.proc.pid)
        mounts.clear()
        for target in reversed(getattr(self, "_nfs_mounts", [])):
            nfs.unmount(target)
        getattr(self, "_nfs_mounts", []).clear()
        return state, extra

    def _start_sync(self) -> subprocess.Popen[bytes] | None:
        every = self.plan.storage_sync
        writable = any(o.get("store") and not o.get("fuse")
                       for o in self.plan.outputs.values()) or any(
            m.get("store") and not m.get("read_only") and not m.get("fuse")
            for m in self.plan.mounts)
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
        if not self._has_storage(copied=True):
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
