"""One node's stack dump (node/stacks.py) of real processes: ranks found by the attempt's
process tag and their rank variables (a shell before python, Open MPI's rank over RANK),
Python ones dumped by the real py-spy, others described by the kernel's view."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from batchyard.debug.stacks import group
from batchyard.node.stacks import dump_node, find_py_spy

WAIT = """\
import time


def parked():
    time.sleep(600)


print("up", flush=True)
parked()
"""


@pytest.fixture
def tagged() -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    tag = f"{uuid.uuid4()}/0"
    base = {**os.environ, "BATCHYARD_PROC_TAG": tag}
    started = [
        # rank 0: a shell that forks python (it has more to do after it)
        subprocess.Popen(["bash", "-c", f"{sys.executable} -c '{WAIT}'; true"],
                         env={**base, "RANK": "0"}, stdout=subprocess.PIPE,
                         start_new_session=True),
        subprocess.Popen(["sleep", "600"], env={**base, "RANK": "1"}),
        # an MPI rank: Open MPI's rank wins over a RANK it inherited
        subprocess.Popen([sys.executable, "-c", WAIT],
                         env={**base, "RANK": "7", "OMPI_COMM_WORLD_RANK": "2"},
                         stdout=subprocess.PIPE),
        subprocess.Popen(["sleep", "600"], env=base),  # no rank: an mpirun, an orted
    ]
    for proc in (started[0], started[2]):
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    try:
        yield tag, started
    finally:
        os.killpg(started[0].pid, signal.SIGKILL)  # the shell's python too
        for proc in started:
            proc.kill()
        for proc in started:
            proc.wait()


def _ranks(dump: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    return {r["rank"]: r["processes"] for r in dump["ranks"]}


def test_every_rank_of_the_tag_is_dumped(tagged: tuple[str, list[Any]]) -> None:
    tag, started = tagged
    assert find_py_spy() is not None  # py-spy is a dependency (pyproject)
    began = time.monotonic()
    dump = dump_node(tag, 0, "n0")
    assert time.monotonic() - began < 20
    ranks = _ranks(dump)
    assert sorted(ranks) == [0, 1, 2]  # the rankless process is no rank's
    shell, python = ranks[0]
    assert shell["pid"] == started[0].pid and not shell["python"]
    assert python["python"] and python["native"]
    assert ranks[1][0]["note"].startswith("not a Python process (sleep)")
    assert ranks[1][0]["state"] == "S" and ranks[1][0]["wchan"]
    assert ranks[2][0]["pid"] == started[2].pid
    where = {g.label: g.where for g in group([dump])}
    assert where == {"rank 1": where["rank 1"], "ranks 0,2": "in parked (<string>:5)"}
    assert where["rank 1"].startswith("in sleep (not Python; state S")


def test_without_py_spy_the_dump_says_how_to_get_it(tagged: tuple[str, list[Any]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    tag, _ = tagged
    monkeypatch.setenv("BATCHYARD_PY_SPY", "/nonexistent/py-spy")
    dump = dump_node(tag, 0, "n0")
    errors = [p.get("error") for p in _ranks(dump)[2]]
    assert errors == ["py-spy not found: pip install py-spy on the node, or set "
                      "BATCHYARD_PY_SPY"]
    assert dump["py_spy"] is None
