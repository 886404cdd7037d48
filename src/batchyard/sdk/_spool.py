"""The on-disk spool of metric batches the server has not taken yet: one JSON line per batch,
one file per process. A process adopts the spool files that dead processes of the same job
left on this host, so values logged just before a crash reach the server with the next one."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

INIT_PID_NS = 0xEFFFFFFC  # the kernel's inode number of the initial PID namespace
Sender = Callable[[dict[str, Any]], str]


def new_batch(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"batch": uuid.uuid4().hex, "metrics": records}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _host() -> str:
    """This host's name, and the PID namespace's unless it is the host's own (a rank in the
    sandbox's namespace, node/pidns.py, or a container): only pids of one namespace can be
    told alive or dead, and virtual nodes of one machine share the spool directory."""
    host = socket.gethostname().replace("-", "_") or "host"
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return host
    return host if namespace == INIT_PID_NS else f"{host}_pidns{namespace}"


class Spool:
    def __init__(self, directory: Path, attempt: int, rank: int | None) -> None:
        self.directory = directory
        self.host = _host()
        self.pid = os.getpid()
        tag = "x" if rank is None else str(rank)
        self.path = directory / f"{self.host}-{self.pid}-a{attempt}-r{tag}.jsonl"
        self._count = 0
        self._adopted = False

    def count(self) -> int:
        """Values waiting in this process's spool file."""
        return self._count

    def append(self, entry: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
        self._count += len(entry.get("metrics") or [])

    def resend(self, send: Sender) -> bool:
        """Send spooled batches in order until one must wait; True when none is left."""
        if not self._adopted:
            self._adopted = True
            self._adopt()
        if self._count == 0 and not self.path.exists():
            return True
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            self._count = 0
            return True
        remaining: list[str] = []
        for index, line in enumerate(lines):
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line torn by a crash mid-write
            if send(entry) == "retry":
                remaining = lines[index:]
                break
        self._rewrite(remaining)
        return not remaining

    def _rewrite(self, lines: list[str]) -> None:
        if not lines:
            self.path.unlink(missing_ok=True)
            self._count = 0
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp, self.path)
        count = 0
        for line in lines:
            with contextlib.suppress(ValueError):
                count += len(json.loads(line).get("metrics") or [])
        self._count = count

    def _adopt(self) -> None:
        """Take over spool files of dead processes on this host (renamed first, so two
        adopters cannot both send them)."""
        if not self.directory.is_dir():
            return
        for orphan in sorted(self.directory.glob(f"{self.host}-*.jsonl")):
            try:
                pid = int(orphan.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if pid == self.pid or _alive(pid):
                continue
            claimed = orphan.with_name(f"{orphan.name}.adopted-{self.pid}")
            try:
                os.rename(orphan, claimed)
            except OSError:
                continue  # someone else took it
            text = claimed.read_text(encoding="utf-8")
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(text if text.endswith("\n") or not text else text + "\n")
            for line in text.splitlines():
                with contextlib.suppress(ValueError):
                    self._count += len(json.loads(line).get("metrics") or [])
            claimed.unlink(missing_ok=True)
