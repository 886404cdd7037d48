"""Stack dumps of this node's ranks (standard library only: the launcher runs under
``python -S``), for the hang watchdog and `job stacks`.

A rank is found the way teardown finds what to kill: by the attempt's process tag in the
environment of every process the launcher started, directly or not (an MPI rank is a child
of orted or mpirun), with its global rank read from the variables the launcher or the MPI
library gave it. Python processes are dumped with ``py-spy dump --json --native`` (native
frames where they can be unwound; without them when they cannot); for others the kernel's
view (state, wait channel) is all there is, and the dump says so.

A job in a container: its processes are this host's processes too, and py-spy run here as
root reads them across the container's namespaces; nothing is run inside the container."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchyard.node import pidns

PY_SPY_TIMEOUT = 10.0
MAX_PROCESSES = 64  # per node and dump: a rank with a big pool of workers is cut here
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK")  # MPI's own first: it is the rank
_PYTHON_EXE = re.compile(r"^(python|pypy)[0-9.]*[a-z]?$")


def find_py_spy(env: dict[str, str] | None = None) -> str | None:
    """``$BATCHYARD_PY_SPY``, else py-spy on PATH, else next to this interpreter (the
    venv batchyard runs from: its PATH need not have it)."""
    env = dict(os.environ) if env is None else env
    configured = env.get("BATCHYARD_PY_SPY")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    found = shutil.which("py-spy", path=env.get("PATH"))
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else None


# --- processes ----------------------------------------------------------------------------

def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) from /proc/PID/stat."""
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    rest = data[data.rindex(b")") + 2:].split()
    return rest[0].decode(), int(rest[1])


def rank_of(environ: bytes) -> int | None:
    """The global rank in a NUL-separated environment block."""
    values = {}
    for item in environ.split(b"\0"):
        key, _, value = item.partition(b"=")
        name = key.decode(errors="replace")
        if name in RANK_VARS and value.isdigit():
            values[name] = int(value)
    return next((values[k] for k in RANK_VARS if k in values), None)


def is_python(pid: int) -> bool:
    """Its executable is named like an interpreter, or it has libpython mapped (an
    embedding program, a renamed interpreter)."""
    with contextlib.suppress(OSError):
        if _PYTHON_EXE.match(os.path.basename(os.readlink(f"/proc/{pid}/exe"))):
            return True
    return b"libpython" in _read(f"/proc/{pid}/maps")


def rank_processes(tag: str) -> dict[int, list[int]]:
    """Global rank -> the pids carrying it, parents before children. Processes of the
    attempt without a rank (mpirun, orted, the relay, the preparation) are no rank's."""
    needle = f"BATCHYARD_PROC_TAG={tag}\0".encode()
    me = os.getpid()
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        environ = _read(f"/proc/{entry}/environ") + b"\0"
        if needle not in environ or pidns.is_forwarder(int(entry)):
            continue  # (the sandbox's signal forwarder: its child is the rank's process)
        state = _stat(int(entry))
        if state is None or state[0] in ("Z", "X"):
            continue
        rank = rank_of(environ)
        if rank is not None:
            found.setdefault(rank, []).append(int(entry))
    return {rank: _parents_first(pids) for rank, pids in sorted(found.items())}


def _parents_first(pids: list[int]) -> list[int]:
    parent = {p: (_stat(p) or ("?", 0))[1] for p in pids}

    def depth(pid: int) -> int:
        level = 0
        while parent.get(pid) in parent and level < 64:
            pid, level = parent[pid], level + 1
        return level

    return sorted(pids, key=lambda p: (depth(p), p))


def _process_info(pid: int) -> dict[str, Any]:
    state = _stat(pid)
    exe = ""
    with contextlib.suppress(OSError):
        exe = os.readlink(f"/proc/{pid}/exe")
    cmdline = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
    return {"pid": pid, "exe": exe, "cmdline": cmdline.strip()[:500],
            "state": state[0] if state else None,
            "wchan": _read(f"/proc/{pid}/wchan").decode(errors="replace") or None}


# --- py-spy -------------------------------------------------------------------------------

def _frames(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Innermost first, as py-spy gives them; a native frame names its library."""
    return [{"name": str(f.get("name")),
             "file": str(f.get("short_filename") or f.get("filename")),
             "path": str(f.get("filename")), "line": int(f.get("line") or 0),
             "native": bool(f.get("module"))} for f in raw if isinstance(f, dict)]


def py_spy_dump(pid: int, py_spy: str, native: bool = True,
                timeout: float = PY_SPY_TIMEOUT, inside: bool = False) -> dict[str, Any]:
    """{"threads": [...]} or {"error": why}; without native frames when unwinding them
    fails (a stripped library, another container's libraries). ``inside``: py-spy runs in
    the process's PID namespace (the rank sandbox's, node/pidns.py), where the thread ids
    its Python knows are the kernel's, for native frames."""
    own = pidns.ns_pid(pid) if inside else None
    argv = [py_spy, "dump", "--pid", str(own or pid), "--json"] + (
        ["--native"] if native else [])
    if own is not None:
        argv = [sys.executable, "-I", "-S", pidns.__file__, "--in", str(pid), "--", *argv]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": f"py-spy did not answer within {timeout:g}s"}
    except OSError as exc:
        return {"error": f"py-spy could not run: {exc}"}
    try:
        threads = json.loads(proc.stdout)
        if not isinstance(threads, list):
            raise ValueError("not a list of threads")
    except ValueError:
        if native:
            fallback = py_spy_dump(pid, py_spy, native=False, timeout=timeout, inside=inside)
            if "threads" in fallback:
                fallback["note"] = "native frames could not be read: " + first_error(
                    proc.stderr)
            return fallback
        return {"error": first_error(proc.stderr) or f"py-spy exited with {proc.returncode}"}
    return {"native": native, "threads": [
        {"thread_id": t.get("thread_id"), "os_thread_id": t.get("os_thread_id"),
         "name": t.get("thread_name"), "active": bool(t.get("active")),
         "owns_gil": bool(t.get("owns_gil")), "frames": _frames(t.get("frames") or [])}
        for t in threads if isinstance(t, dict)]}


def first_error(text: str) -> str:
    """py-spy's own error line, without its backtrace."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    for line in lines:
        if line.startswith("Error:"):
            return line.removeprefix("Error:").strip()[:300]
    return lines[0][:300] if lines else ""


# --- one node's dump ----------------------------------------------------------------------

def dump_node(tag: str, node_rank: int, node_name: str, *, in_container: bool = False,
              py_spy: str | None = None) -> dict[str, Any]:
    """Every rank of this node: each of its processes, Python ones with their stacks."""
    started = time.time()
    py_spy = py_spy or find_py_spy()
    ranks = []
    budget = MAX_PROCESSES
    for rank, pids in rank_processes(tag).items():
        processes = []
        for pid in pids[:max(budget, 1)]:
            info = _process_info(pid)
            info["python"] = is_python(pid)
            if not info["python"]:
                name = os.path.basename(info["exe"]) or "?"
                info["note"] = (f"not a Python process ({name}): no Python stack; the "
                                "kernel's view is its state and wait channel")
            elif py_spy is None:
                info["error"] = ("py-spy not found: pip install py-spy on the node, or set "
                                 "BATCHYARD_PY_SPY")
            else:
                info.update(py_spy_dump(pid, py_spy, inside=not in_container))
            processes.append(info)
        budget -= len(processes)
        ranks.append({"rank": rank, "processes": processes})
    out: dict[str, Any] = {"node_rank": node_rank, "node": node_name, "taken_at": started,
                           "took": round(time.time() - started, 3), "py_spy": py_spy,
                           "ranks": ranks}
    if in_container:
        out["note"] = "the job runs in a container: its processes were read from the host"
    if not ranks:
        out["note"] = "no rank process runs on this node now"
    return out


class StackDumper:
    """Takes the dumps the server asks for (by id, each once), off the launcher's loops:
    py-spy pauses each rank a moment, and the launcher must keep reaping meanwhile."""

    def __init__(self, tag: str, node_rank: int, node_name: str,
                 send: Callable[[dict[str, Any]], None], say: Callable[[str], None],
                 in_container: bool = False) -> None:
        self.tag, self.node_rank, self.node_name = tag, node_rank, node_name
        self.send, self.say, self.in_container = send, say, in_container
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def requested(self, requests: list[dict[str, Any]]) -> None:
        for request in requests:
            ident = str(request.get("id") or "")
            with self._lock:
                if not ident or ident in self._seen:
                    continue
                self._seen.add(ident)
            threading.Thread(target=self._take, args=(ident, str(request.get("reason"))),
                             name=f"stacks-{ident}", daemon=True).start()

    def _take(self, ident: str, reason: str) -> None:
        try:
            dump = dump_node(self.tag, self.node_rank, self.node_name,
                             in_container=self.in_container)
            dump.update(id=ident, reason=reason)
            count = sum(len(r["processes"]) for r in dump["ranks"])
            self.say(f"stack dump {ident} ({reason}): {count} process(es) in {dump['took']}s")
            self.send(dump)
        except Exception as exc:  # a dump must never take the launcher down
            self.say(f"stack dump {ident} failed: {exc!r}")
