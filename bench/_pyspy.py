"""py-spy of running processes, summarized: where their time goes, as shares of the samples
(inclusive: a function and what it calls; self: the function's own frames)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path


def record(pids: list[int], seconds: float, delay: float = 0.0, rate: int = 100,
           top: int = 25, gil: bool = True) -> str:
    """Record every pid for ``seconds`` (after ``delay``), in parallel; a text summary.
    ``gil``: only the thread holding the GIL is sampled, so shares are shares of the
    process's Python time (what a GIL-bound server spends its core on)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return "py-spy is not installed"
    time.sleep(delay)
    folder = Path(tempfile.mkdtemp(prefix="pyspy-"))
    outs: list[tuple[int, Path]] = []
    threads = []
    for pid in pids:
        path = folder / f"{pid}.txt"
        argv = [spy, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r",
                str(rate), "-f", "raw", "-o", str(path), "--nonblocking"]
        if gil:
            argv.append("--gil")
        outs.append((pid, path))
        threads.append(threading.Thread(target=subprocess.run, args=(argv,), kwargs={
            "capture_output": True, "timeout": seconds + 120}, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    texts = []
    for pid, path in outs:
        if path.is_file():
            texts.append(f"-- pid {pid} ({path}) --\n" + summarize(path.read_text(), top))
        else:
            texts.append(f"-- pid {pid}: no profile --")
    return "\n".join(texts)


def _frame(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``: one entry per function."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = where.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else where
    return f"{name} ({short})"


OURS = ("server/", "services/", "routers/", "store/", "scheduler/", "backends/", "node/",
        "agent/", "cli/", "client/", "spec/")


def summarize(collapsed: str, top: int = 25) -> str:
    """Inclusive and self shares, and the innermost batchyard function of each sample (where
    our code hands over to a library: what to change)."""
    incl: dict[str, int] = {}
    own: dict[str, int] = {}
    ours: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        total += count
        frames = [_frame(f) for f in stack.split(";") if f]
        for f in set(frames[1:]):  # the first is the thread / process name
            incl[f] = incl.get(f, 0) + count
        if len(frames) > 1:
            own[frames[-1]] = own.get(frames[-1], 0) + count
        mine = [f for f in frames if "batchyard" in f or f.split("(")[-1].startswith(OURS)]
        key = mine[-1] if mine else "(outside batchyard: " + (frames[-1] if frames else "?") + ")"
        ours[key] = ours.get(key, 0) + count
    if not total:
        return "(no samples)"
    lines = [f"{total} samples; inclusive share, top {top}:"]
    for f, c in sorted(incl.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * c / total:5.1f}%  {f}")
    lines.append(f"innermost batchyard function, top {top}:")
    for f, c in sorted(ours.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * c / total:5.1f}%  {f}")
    lines.append(f"self share, top {top}:")
    for f, c in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * c / total:5.1f}%  {f}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(summarize(Path(sys.argv[1]).read_text(), int(sys.argv[2]) if len(sys.argv) > 2
                    else 25))
