"""Where a launch's time goes, from the outside: every exec of a process tree, with its time,
from the kernel's scheduler tracepoints (``sched_process_fork`` and ``sched_process_exec``
through a tracefs instance of our own; root only). A run's execs, in ms after its submit,
show each step (the sbatch script, srun, the node launchers, sandbox helpers, the ranks)
without a line of batchyard changed and without slowing it (strace's ptrace did; and here
strace -p -f did not follow the children of an attached process).

Only the descendants of the given roots are kept (other users of the machine fork too); the
command line of each exec is read from /proc as soon as it is seen (a helper gone by then
shows its binary)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

TRACEFS = Path("/sys/kernel/tracing")
LINE = re.compile(r"\s(\d+\.\d+): (sched_process_fork|sched_process_exec): (.*)$")
LABELS = (("batchyard.node.slurm", "python -S -m batchyard.node.slurm (srun task: the launcher)"),
          ("-m batchyard.node ", "python -S -m batchyard.node (launcher)"),
          ("slurm_script", "batch script (slurmstepd)"), ("hello.py", "rank (python hello.py)"),
          ("batchyard.node", "python -m batchyard.node.* (helper)"),
          ("torch.distributed.run", "torchrun"))
TOOLS = ("sbatch", "squeue", "scontrol", "sinfo", "srun", "scancel", "bwrap", "unshare",
         "setpriv", "mkdir", "nsenter", "sh", "bash", "slurmstepd")


class Tracer:
    def __init__(self, roots: dict[str, int], folder: Path) -> None:
        self.roots = roots
        self.folder = folder
        self.instance = TRACEFS / "instances" / f"batchyard-bench-{os.getpid()}"
        self.offset = time.time() - time.monotonic()
        self.owner: dict[int, str] = {}  # tid -> root name
        parent: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        for pid in parent:  # the roots and what they started already (a zygote, a pool)
            ancestor, hops = pid, 0
            while ancestor > 1 and hops < 64:
                found = next((n for n, r in roots.items() if r == ancestor), None)
                if found is not None:
                    with contextlib.suppress(OSError):
                        for tid in os.listdir(f"/proc/{pid}/task"):
                            self.owner[int(tid)] = found
                    self.owner[pid] = found
                    break
                ancestor, hops = parent.get(ancestor, 0), hops + 1
        self.events: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> Tracer:
        self.instance.mkdir()
        (self.instance / "trace_clock").write_text("mono")
        (self.instance / "buffer_size_kb").write_text("8192")
        for event in ("sched_process_fork", "sched_process_exec"):
            (self.instance / "events" / "sched" / event / "enable").write_text("1")
        self._thread.start()
        time.sleep(0.2)
        return self

    def _read(self) -> None:
        fd = os.open(self.instance / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
        buf = b""
        try:
            while not self._stop.is_set():
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    time.sleep(0.002)
                    continue
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self._line(line.decode(errors="replace"))
        finally:
            os.close(fd)

    def _line(self, line: str) -> None:
        m = LINE.search(line)
        if m is None:
            return
        fields = dict(kv.split("=", 1) for kv in m.group(3).split() if "=" in kv)
        if m.group(2) == "sched_process_fork":
            parent = int(fields.get("pid", "0"))
            if parent in self.owner:
                self.owner[int(fields.get("child_pid", "0"))] = self.owner[parent]
            return
        pid = int(fields.get("pid", "0"))
        if pid not in self.owner:
            return
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            words = [w.decode(errors="replace") for w in argv]
        except OSError:
            words = [fields.get("filename", "?")]
        name = label(words)
        if name is not None:
            self.events.append((float(m.group(1)) + self.offset, name, self.owner[pid]))

    def stop(self) -> None:
        time.sleep(0.3)
        self._stop.set()
        self._thread.join(timeout=10)
        for event in ("sched_process_fork", "sched_process_exec"):
            with contextlib.suppress(OSError):
                (self.instance / "events" / "sched" / event / "enable").write_text("0")
        with contextlib.suppress(OSError):
            self.instance.rmdir()
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "execs.txt").write_text("".join(
            f"{t:.6f}\t{name}\t{where}\n" for t, name, where in sorted(self.events)))


def start(roots: dict[str, int], folder: Path) -> Tracer:
    if not (TRACEFS / "instances").is_dir() or os.geteuid() != 0:
        raise SystemExit("--trace needs root and tracefs (/sys/kernel/tracing)")
    shutil.rmtree(folder, ignore_errors=True)
    return Tracer(roots, folder).start()


def stop(tracer: Tracer | None) -> None:
    if tracer is not None:
        tracer.stop()


def label(argv: list[str]) -> str | None:
    text = " ".join(argv) + " "
    for key, name in LABELS:
        if key in text:
            return name
    tool = Path(argv[0]).name if argv else ""
    if tool in TOOLS:
        return tool if tool not in ("sh", "bash") else f"{tool} {' '.join(argv[1:3])[:40]}"
    if tool.startswith("python"):
        words = [Path(a).name if a.endswith(".py") else a for a in argv[1:4]]
        return "python " + " ".join(a if len(a) < 40 else a[:37] + "..." for a in words)
    return None


def events(folder: Path) -> list[tuple[float, str, str]]:
    out = []
    for line in (folder / "execs.txt").read_text().splitlines():
        t, name, where = line.split("\t")
        out.append((float(t), name, where))
    return out


def timeline(folder: Path, marks: list[Any], times: dict[str, list[float]]) -> str:
    """For each mark ``[kind, i, t0]``: the execs until the next mark, first time (and last
    time and count when repeated) in ms after ``t0``, with the tree they ran in."""
    found = events(folder)
    marks = sorted(marks, key=lambda m: m[2])
    lines = []
    for n, (kind, i, t0) in enumerate(marks):
        end = marks[n + 1][2] if n + 1 < len(marks) else t0 + 30
        took = times[kind][i] if i < len(times.get(kind, [])) else float("nan")
        lines.append(f"{kind} run {i}: all ranks in user code after {took * 1000:.0f} ms")
        seen: dict[str, list[float]] = {}
        for t, name, where in found:
            if t0 <= t < end:
                seen.setdefault(f"{name} [{where}]", []).append((t - t0) * 1000)
        for name, at in sorted(seen.items(), key=lambda kv: kv[1][0]):
            extra = f" .. {at[-1]:.0f} ({len(at)}x)" if len(at) > 1 else ""
            lines.append(f"  {at[0]:7.0f}{extra} ms  {name}")
    return "\n".join(lines)
