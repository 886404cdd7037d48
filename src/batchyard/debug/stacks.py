"""Stack dumps of a gang, folded: ranks whose main threads stand in the same Python frames
form one group, so that in a dump of 64 ranks the one stuck elsewhere stands out
("rank 3 in all_reduce (train.py:42)" against "ranks 0-2,4-7 in barrier (train.py:10)").

Pure functions over the JSON the node launchers send (node/stacks.py), shared by the
server (a hang's message names where the ranks are) and the CLI (`job stacks`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

Key = tuple[Any, ...]


@dataclass
class Group:
    ranks: list[int]
    where: str
    frames: list[str] = field(default_factory=list)  # outermost first
    nodes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{'rank' if len(self.ranks) == 1 else 'ranks'} {rank_ranges(self.ranks)}"

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "label": self.label, "where": self.where,
                "frames": self.frames, "nodes": self.nodes}


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 4, 5, 7] -> "0-2,4-5,7"."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def frame_text(frame: dict[str, Any]) -> str:
    line = frame.get("line") or 0
    return f"{frame.get('name')} ({frame.get('file')}:{line})" if line else \
        f"{frame.get('name')} ({frame.get('file')})"


def main_process(rank: dict[str, Any]) -> dict[str, Any] | None:
    """The rank's own process: its first Python process with a stack (a shell that
    started python comes first in the tree), else its first process."""
    processes = rank.get("processes") or []
    for proc in processes:
        if proc.get("threads"):
            return dict(proc)
    return dict(processes[0]) if processes else None


def main_thread(proc: dict[str, Any]) -> dict[str, Any] | None:
    """The thread whose id is the process's; in a container py-spy may give the thread
    ids of the container's pid namespace, so then the one started by the interpreter
    (outermost frame ``<module>``, not ``Thread._bootstrap``), else the last listed (the
    interpreter lists its threads newest first)."""
    threads = [t for t in proc.get("threads") or [] if isinstance(t, dict)]
    for thread in threads:
        if thread.get("os_thread_id") == proc.get("pid") or thread.get("name") == "MainThread":
            return dict(thread)
    for thread in threads:
        python = [f for f in thread.get("frames") or [] if not f.get("native")]
        if python and python[-1].get("name") == "<module>":
            return dict(thread)
    return dict(threads[-1]) if threads else None


def signature(rank: dict[str, Any]) -> tuple[Key, str, list[str]]:
    """(what groups it, where it is in words, its Python frames outermost first)."""
    proc = main_process(rank)
    if proc is None:
        return ("absent",), "no process", []
    thread = main_thread(proc)
    if thread is not None:
        frames = [f for f in thread.get("frames") or [] if not f.get("native")]
        if frames:
            key = tuple((f.get("name"), f.get("file"), f.get("line")) for f in frames)
            return ("py", *key), f"in {frame_text(frames[0])}", \
                [frame_text(f) for f in reversed(frames)]
        return ("py-empty",), "in native code only (no Python frame)", []
    if proc.get("error"):
        return ("error", proc["error"]), f"no stack: {proc['error']}", []
    exe = os.path.basename(str(proc.get("exe") or "")) or "?"
    state, wchan = proc.get("state") or "?", proc.get("wchan") or "?"
    return ("other", exe, state, wchan), f"in {exe} (not Python; state {state}, waiting in " \
        f"{wchan})", []


def group(dumps: list[dict[str, Any]]) -> list[Group]:
    """Ranks of every node's dump, grouped by signature; the smallest groups first (the
    odd ones out), then by their first rank."""
    by_key: dict[Key, Group] = {}
    for dump in dumps:
        node = str(dump.get("node") or f"node {dump.get('node_rank')}")
        for rank in dump.get("ranks") or []:
            key, where, frames = signature(rank)
            found = by_key.setdefault(key, Group([], where, frames))
            found.ranks.append(int(rank["rank"]))
            if node not in found.nodes:
                found.nodes.append(node)
    groups = list(by_key.values())
    for g in groups:
        g.ranks.sort()
    groups.sort(key=lambda g: (len(g.ranks), g.ranks[0]))
    return groups


def summary(groups: list[Group], limit: int = 4) -> str:
    """One line: "rank 3 in f (a.py:3); ranks 0-2 in g (b.py:9)"."""
    if not groups:
        return "no rank process was found"
    parts = [f"{g.label} {g.where}" for g in groups[:limit]]
    if len(groups) > limit:
        parts.append(f"{len(groups) - limit} more group(s)")
    return "; ".join(parts)


def render(groups: list[Group], depth: int = 12) -> list[str]:
    """Text lines: each group's label, where, nodes, then its innermost ``depth`` frames."""
    lines: list[str] = []
    largest = max((len(g.ranks) for g in groups), default=0)
    for g in groups:
        odd = "  <- differs" if len(groups) > 1 and len(g.ranks) < largest else ""
        lines.append(f"{g.label} {g.where}  [{', '.join(g.nodes)}]{odd}")
        shown = g.frames[-depth:]
        if len(g.frames) > len(shown):
            lines.append(f"    ... {len(g.frames) - len(shown)} outer frame(s)")
        lines += [f"    {f}" for f in shown]
    return lines


def render_raw(dumps: list[dict[str, Any]]) -> list[str]:
    """Every process and thread of every rank, native frames too (`job stacks --raw`)."""
    lines: list[str] = []
    for dump in dumps:
        lines.append(f"== node {dump.get('node')} (node rank {dump.get('node_rank')})"
                     + (f": {dump['note']}" if dump.get("note") else ""))
        for rank in dump.get("ranks") or []:
            for proc in rank.get("processes") or []:
                lines.append(f"-- rank {rank['rank']}: pid {proc.get('pid')} "
                             f"{proc.get('cmdline') or proc.get('exe')}")
                for key in ("note", "error"):
                    if proc.get(key):
                        lines.append(f"   {proc[key]}")
                for thread in proc.get("threads") or []:
                    name = thread.get("name") or thread.get("os_thread_id")
                    flags = " (active)" if thread.get("active") else " (idle)"
                    lines.append(f"   thread {name}{flags}")
                    lines += [f"      {frame_text(f)}" for f in thread.get("frames") or []]
    return lines
