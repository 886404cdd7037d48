"""The rank sandbox's PID namespace (node/pidns.py): the forwarder the launcher starts passes
signals on and ends exactly as the job's process did; killing it leaves nothing behind; the
namespace shows only the job's processes, and its keeper, shared by the launchers of one
attempt on one machine, kills what is left when the last lets go."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import strictkit
from batchyard.node import pidns, proctree, sandbox


def _alive(pid: int) -> bool:
    return proctree.alive(pid)


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: a pid's identity over time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()[19].decode()


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as fh:
            keep = ("Name", "State", "PPid", "NSpid", "SigBlk", "SigCgt")
            return "; ".join(line.strip() for line in fh if line.split(":")[0] in keep)
    except OSError as exc:
        return str(exc)


@pytest.fixture
def keeper() -> Iterator[pidns.Keeper]:
    said: list[str] = []
    keeper = pidns.Keeper(f"test-{uuid.uuid4()}", said.append)
    why = keeper.start()
    if why is not None:
        strictkit.missing(f"no PID namespace here: {why}")
    yield keeper
    keeper.stop()


def _start(keeper: pidns.Keeper, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
    spec = {"hide": [], "binds": [], "ro_binds": [], "pidns": keeper.spec()}
    return subprocess.Popen([sys.executable, "-I", "-S", sandbox.__file__, json.dumps(spec),
                             "--", *argv], **kw)  # type: ignore[call-overload]


def _child(proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 10
    while (child := pidns.forwarded(proc.pid)) is None:
        assert time.monotonic() < deadline, "the forwarder never forked"
        time.sleep(0.01)
    return child


@pytest.mark.parametrize(("argv", "code"), [
    (["sh", "-c", "exit 3"], 3),
    (["sh", "-c", "kill -9 $$"], 137),
    (["sh", "-c", "kill -TERM $$"], 143),
    (["sh", "-c", "kill -SEGV $$"], 139),
])
def test_it_ends_as_the_job_process_did(keeper: pidns.Keeper, argv: list[str],
                                        code: int) -> None:
    proc = _start(keeper, argv)
    _, status = os.waitpid(proc.pid, 0)
    proc.returncode = 0  # (reaped here)
    assert proctree.exit_code(status) == code
    assert not os.WCOREDUMP(status)  # the forwarder leaves no core of its own


def test_sigterm_reaches_the_rank_which_ends_cleanly_in_its_grace(keeper: pidns.Keeper,
                                                                 tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = _start(keeper, ["bash", "-c", f"trap 'echo bye; exit 0' TERM; touch {ready}; "
                           "sleep 30 >/dev/null & wait"], stdout=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and out == b"bye\n"
    assert time.monotonic() - began < 2


def test_a_killed_forwarder_leaves_no_rank(keeper: pidns.Keeper) -> None:
    proc = _start(keeper, ["sleep", "30"])
    child = _child(proc)
    assert _alive(child) and child != proc.pid
    born = _started(child)
    proc.kill()
    assert proc.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 20  # (a loaded CI machine: the kill is prompt, its reaping not)
    # (a zombie until something reaps it: not alive; its pid taken again by another
    # process, which a busy machine's 32,768 pids allow: not it)
    while _alive(child) and _started(child) == born:
        assert time.monotonic() < deadline, (
            f"the rank outlived its forwarder: {_describe(child)}")
        time.sleep(0.02)


def test_the_namespace_shows_the_jobs_processes_only(keeper: pidns.Keeper) -> None:
    proc = _start(keeper, ["sh", "-c", "ls /proc | grep -c '^[0-9]'; echo $$; "
                           "cat /proc/1/environ >/dev/null 2>&1 && echo leak; "
                           "ls /proc/1/root/ >/dev/null 2>&1 && echo leak; true"],
                  stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=20)
    count, me = out.decode().split()[:2]
    assert "leak" not in out.decode()
    assert int(count) <= 4 and int(me) < 10  # PID 1, the shell, ls and grep


def test_launchers_of_one_attempt_share_it_and_the_last_ends_it(keeper: pidns.Keeper) -> None:
    other = pidns.Keeper(keeper.attempt, lambda _: None)
    assert other.start() is None
    assert other.spec() == keeper.spec()  # one namespace for the machine's nodes
    proc = _start(keeper, ["sleep", "30"])
    child = _child(proc)
    keeper.stop()
    assert _alive(child)  # the other node holds it still
    other.stop()
    assert proc.wait(timeout=10) == -signal.SIGKILL and not _alive(child)
    assert not os.path.exists(pidns.socket_path(keeper.attempt))


LAUNCHER = """
import json, subprocess, sys, time
from batchyard.node import pidns, proctree, sandbox
proctree.become_subreaper()
keeper = pidns.Keeper(sys.argv[1], print)
assert keeper.start() is None
spec = {"hide": [], "binds": [], "ro_binds": [], "pidns": keeper.spec()}
rank = subprocess.Popen([sys.executable, "-I", "-S", sandbox.__file__, json.dumps(spec), "--",
                         "sleep", "60"], preexec_fn=proctree.die_with_parent)
while pidns.forwarded(rank.pid) is None:
    time.sleep(0.01)
print(keeper.pid, keeper.pid1, pidns.forwarded(rank.pid), flush=True)
time.sleep(60)
"""


def test_a_killed_launcher_leaves_nothing(tmp_path: Path) -> None:
    """SIGKILL to a launcher: its rank dies with its forwarder, and the keeper, whose last
    holder is gone, kills the namespace and ends (whoever reaps the rank's zombie)."""
    attempt = f"test-{uuid.uuid4()}"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, attempt],
                                stdout=subprocess.PIPE)
    assert launcher.stdout is not None
    line = launcher.stdout.readline().split()
    if not line:
        strictkit.missing("no PID namespace here")
    keeper, _, rank = (int(x) for x in line)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + pidns.ZAP_WAIT + 5
    while _alive(rank) or _alive(keeper):
        assert time.monotonic() < deadline, ("left behind", _alive(rank), _alive(keeper))
        time.sleep(0.05)
    assert not os.path.exists(pidns.socket_path(attempt))
