"""The kernel OOM killer's work told apart from any SIGKILL, under cgroup v1 and v2 alike
(issue 33, item 12: only v1 was tested, as this machine's memory controller is v1's). The
launcher reads which memory cgroup a rank runs in from /proc/PID/cgroup and that cgroup's
OOM-kill counter (v1 memory.oom_control, v2 memory.events); here both are a made-up tree, so
each layout is checked on any host: v1, pure v2, and v2 mounted beside v1 (hybrid)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchyard.node import failure

PID = 4242
SIGKILLED = 128 + 9


def _tree(tmp_path: Path, layout: str) -> Path:
    """The rank's /proc/PID/cgroup and its cgroup's counter file; returns that file."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / str(PID)).mkdir(parents=True)
    if layout == "v1":
        lines, cgroup, name = "4:memory:/by/job-1\n1:cpu:/\n", root / "memory/by/job-1", \
            "memory.oom_control"
        text = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"
    else:
        lines = "0::/by/job-1\n" if layout == "v2" else "1:cpu:/\n0::/by/job-1\n"
        base = root if layout == "v2" else root / "unified"
        cgroup, name = base / "by/job-1", "memory.events"
        text = "low 0\nhigh 0\nmax 12\noom 1\noom_kill {n}\noom_group_kill 0\n"
    (proc / str(PID) / "cgroup").write_text(lines)
    cgroup.mkdir(parents=True)
    counter = cgroup / name
    counter.write_text(text.format(n=0))
    counter.with_suffix(".template").write_text(text)
    return counter


@pytest.fixture(params=["v1", "v2", "hybrid"])
def counter(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Path:
    path = _tree(tmp_path, request.param)
    monkeypatch.setattr(failure, "PROC", tmp_path / "proc")
    monkeypatch.setattr(failure, "CGROUP_ROOT", tmp_path / "cgroup")
    monkeypatch.setattr(failure, "forwarded", lambda _pid: None)
    monkeypatch.setattr(failure, "kernel_oom_pids", lambda _since: set())
    return path


def _oom_killed(counter: Path, count: int) -> None:
    counter.write_text(counter.with_suffix(".template").read_text().format(n=count))


def test_the_rank_s_memory_cgroup_is_found(counter: Path) -> None:
    assert failure.memory_cgroups(PID) == [counter.parent]
    assert failure.oom_kills(counter.parent) == 0


def test_a_sigkill_after_the_counter_rose_is_an_oom_kill(counter: Path) -> None:
    watch = failure.OomWatch()
    watch.look([PID], force=True)
    _oom_killed(counter, 1)
    assert watch.killed(PID, SIGKILLED)
    assert not watch.killed(PID, 1)  # not a SIGKILL: the rank's own failure


def test_a_sigkill_without_an_oom_kill_is_not_one(counter: Path) -> None:
    watch = failure.OomWatch()
    watch.look([PID], force=True)
    assert not watch.killed(PID, SIGKILLED)


def test_an_oom_kill_counted_before_the_rank_started_is_not_its_own(counter: Path) -> None:
    _oom_killed(counter, 3)  # an earlier job's, in the same cgroup
    watch = failure.OomWatch()
    watch.look([PID], force=True)
    assert not watch.killed(PID, SIGKILLED)
    _oom_killed(counter, 4)
    assert watch.killed(PID, SIGKILLED)
