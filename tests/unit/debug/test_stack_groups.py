"""Folding a gang's stack dumps (debug/stacks.py): pure logic over the JSON the node
launchers send, so the dumps here are written out as a node would send them."""

from __future__ import annotations

from typing import Any

from batchyard.debug.stacks import group, rank_ranges, render, signature, summary


def frame(name: str, file: str, line: int, native: bool = False) -> dict[str, Any]:
    return {"name": name, "file": file, "path": f"/w/{file}", "line": line, "native": native}


def python_rank(rank: int, *inner: dict[str, Any], pid: int = 0) -> dict[str, Any]:
    pid = pid or 1000 + rank
    frames = [*inner, frame("main", "train.py", 50), frame("<module>", "train.py", 60)]
    return {"rank": rank, "processes": [{"pid": pid, "exe": "/usr/bin/python3", "python": True,
                                         "threads": [{"os_thread_id": pid, "frames": frames}]}]}


BARRIER = frame("barrier", "train.py", 10)
ALL_REDUCE = frame("all_reduce", "train.py", 42)


def test_rank_ranges_fold_runs() -> None:
    assert rank_ranges([0, 1, 2, 4, 5, 6, 7]) == "0-2,4-7"
    assert rank_ranges([3]) == "3"
    assert rank_ranges([5, 1, 3, 2]) == "1-3,5"
    assert rank_ranges([]) == ""


def test_the_odd_rank_stands_out_first() -> None:
    node0 = [python_rank(r, BARRIER) for r in range(3)]
    node0.append(python_rank(3, ALL_REDUCE, frame("__pthread_cond_wait", "libc.so.6", 0, True)))
    dumps: list[dict[str, Any]] = [
        {"node": "n0", "node_rank": 0, "ranks": node0},
        {"node": "n1", "node_rank": 1, "ranks": [python_rank(r, BARRIER) for r in range(4, 8)]},
    ]
    groups = group(dumps)
    assert [g.label for g in groups] == ["rank 3", "ranks 0-2,4-7"]
    assert groups[0].where == "in all_reduce (train.py:42)"  # native frames do not count
    assert groups[1].where == "in barrier (train.py:10)"
    assert groups[0].nodes == ["n0"] and groups[1].nodes == ["n0", "n1"]
    assert groups[1].frames == ["<module> (train.py:60)", "main (train.py:50)",
                                "barrier (train.py:10)"]  # outermost first
    assert summary(groups) == ("rank 3 in all_reduce (train.py:42); "
                               "ranks 0-2,4-7 in barrier (train.py:10)")
    lines = render(groups)
    assert lines[0].startswith("rank 3 in all_reduce (train.py:42)  [n0]")
    assert "differs" in lines[0] and "differs" not in lines[lines.index(next(
        ln for ln in lines if ln.startswith("ranks 0-2,4-7")))]


def test_same_function_other_line_is_another_group() -> None:
    dumps = [{"node": "n0", "ranks": [python_rank(0, frame("step", "t.py", 3)),
                                      python_rank(1, frame("step", "t.py", 4))]}]
    assert len(group(dumps)) == 2


def test_main_thread_and_main_process_are_the_rank() -> None:
    """A shell that started python comes first in the rank's tree; a worker thread and a
    child process (a data loader) do not make the rank look elsewhere."""
    rank = python_rank(0, BARRIER, pid=20)
    rank["processes"][0]["threads"].insert(
        0, {"os_thread_id": 21, "frames": [frame("worker", "loader.py", 7)]})
    shell = {"pid": 19, "exe": "/bin/bash", "python": False, "state": "S", "wchan": "do_wait"}
    child = {"pid": 22, "exe": "/usr/bin/python3", "python": True,
             "threads": [{"os_thread_id": 22, "frames": [frame("fetch", "loader.py", 9)]}]}
    rank["processes"] = [shell, rank["processes"][0], child]
    assert signature(rank)[1] == "in barrier (train.py:10)"


def test_ranks_without_python_stacks_say_why() -> None:
    other = {"rank": 0, "processes": [{"pid": 5, "exe": "/usr/bin/sleep", "python": False,
                                       "state": "S", "wchan": "hrtimer_nanosleep"}]}
    failed = {"rank": 1, "processes": [{"pid": 6, "exe": "/usr/bin/python3", "python": True,
                                        "error": "Permission denied"}]}
    groups = group([{"node": "n0", "ranks": [other, failed]}])
    where = {g.label: g.where for g in groups}
    assert where["rank 0"] == ("in sleep (not Python; state S, waiting in "
                               "hrtimer_nanosleep)")
    assert where["rank 1"] == "no stack: Permission denied"
    assert summary([]) == "no rank process was found"


def test_summary_is_bounded() -> None:
    dumps = [{"node": "n0", "ranks": [python_rank(r, frame("f", "t.py", r + 1))
                                      for r in range(10)]}]
    text = summary(group(dumps), limit=3)
    assert text.endswith("7 more group(s)") and text.count(" in f (") == 3


def test_main_thread_in_a_container_namespace() -> None:
    """py-spy across a container's pid namespace gives that namespace's thread ids: the
    main thread is then the one the interpreter started, not the first listed."""
    rank = python_rank(0, BARRIER, pid=7000)
    main = rank["processes"][0]["threads"][0]
    main["os_thread_id"] = 1
    worker = {"os_thread_id": 9, "frames": [frame("socket.accept", "socket.py", 294),
                                            frame("Thread._bootstrap", "threading.py", 995)]}
    rank["processes"][0]["threads"] = [worker, main]
    assert signature(rank)[1] == "in barrier (train.py:10)"
