"""`batchyard job tensorboard` runs the real TensorBoard on jobs' event files (written here by
PyTorch's SummaryWriter in real jobs): while a job runs (its launcher sends the files every
second in this server's settings) and after it ends, one output or all, several jobs side by
side; the test asks TensorBoard's own HTTP API. Ctrl-C stops it and leaves no TensorBoard
behind; bad input is said with the CLI's exit codes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import strictkit
from yardkit import CLUSTER, Yard, pids_where, wait_until

strictkit.importorskip("tensorboard")
strictkit.importorskip("torch")
pytestmark = pytest.mark.timeout(300)

WRITER = '''
import os, sys, time
from torch.utils.tensorboard import SummaryWriter
steps, pause = int(sys.argv[1]), float(sys.argv[2])
writers = [SummaryWriter(os.path.join(os.environ[f"BATCHYARD_OUTPUT_{o}"], "train"))
           for o in sys.argv[3:]]
for step in range(steps):
    for w in writers:
        w.add_scalar("loss", 1.0 / (step + 1), step)
        w.flush()
    time.sleep(pause)
for w in writers:
    w.close()
'''


@pytest.fixture(scope="module")
def tb_yard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env["BATCHYARD_EVENT_SYNC_SECONDS"] = "1"
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", CLUSTER, "-s", "Standard_D2_v2", "-t", "2")
        y.wait_cluster(CLUSTER, 2)
        yield y
    finally:
        y.stop()


def _job(y: Yard, name: str, steps: int, pause: float, outputs: tuple[str, ...] = ("TB",),
         wait: bool = True) -> dict[str, Any]:
    path = y.write_job(name, {"name": name, "cluster": CLUSTER, "code": ".",
                              "command": f"python writer.py {steps} {pause} "
                                         + " ".join(outputs),
                              "outputs": {o: {} for o in outputs}}, {"writer.py": WRITER})
    y.ok("job", "create", "-f", str(path))
    return y.wait_job(name, timeout=120) if wait else y.job(name)


class Board:
    """`batchyard job tensorboard ARGS` as a subprocess; its URL once it printed it."""

    def __init__(self, y: Yard, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "batchyard.cli.main", "job",
                                      "tensorboard", *args], env=y.env, cwd=y.work,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert line.startswith("http://127.0.0.1:"), (line, self.stop())
        self.url = line.strip()

    def get(self, path: str, **params: Any) -> Any:
        answer = httpx.get(self.url + path, params=params, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def steps(self, run: str) -> list[int]:
        rows = self.get("data/plugin/scalars/scalars", run=run, tag="loss")
        return [int(r[1]) for r in rows]

    def stop(self) -> tuple[int | None, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode, self.proc.stderr.read() if self.proc.stderr else ""


def _boards_left(y: Yard) -> list[int]:
    """TensorBoard processes on this yard's files (by their command line)."""
    home = str(y.home).encode()
    found = []
    for pid in pids_where(lambda blob: b"tensorboard.main" in blob and home in blob):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            if b"tensorboard.main" in fh.read():
                found.append(pid)
    return found


def test_a_running_job_is_followed(tb_yard: Yard) -> None:
    _job(tb_yard, "live", steps=120, pause=0.25, wait=False)
    tb_yard.wait_job("live", ("running",), timeout=60)
    board = Board(tb_yard, "live")
    try:
        assert board.get("data/runs") == ["live/TB/train"]
        early = wait_until(lambda: board.steps("live/TB/train"), 60, 0.5, "first steps")
        assert tb_yard.job("live")["state"] == "running"  # seen while it runs
        wait_until(lambda: len(board.steps("live/TB/train")) > len(early) + 5, 60, 1.0,
                   "more steps as the job goes on")
        tb_yard.wait_job("live", timeout=120)
        wait_until(lambda: board.steps("live/TB/train") == list(range(120)), 60, 1.0,
                   "every step once the job ended")
    finally:
        code, err = board.stop()
    assert code == 130, err
    wait_until(lambda: not _boards_left(tb_yard), 20, 0.2, "TensorBoard to be gone")


def test_several_jobs_side_by_side_and_one_output(tb_yard: Yard) -> None:
    _job(tb_yard, "first", steps=5, pause=0.0, outputs=("TB", "EXTRA"))
    _job(tb_yard, "second", steps=8, pause=0.0)
    board = Board(tb_yard, "first", "second")
    try:
        assert sorted(board.get("data/runs")) == ["first/EXTRA/train", "first/TB/train",
                                                  "second/TB/train"]
        assert board.steps("second/TB/train") == list(range(8))
    finally:
        board.stop()
    only = Board(tb_yard, "first", "--output", "EXTRA", "--port", str(_free_port()))
    try:
        assert only.get("data/runs") == ["first/train"]
        assert only.steps("first/train") == list(range(5))
    finally:
        only.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_bad_input(tb_yard: Yard) -> None:
    assert tb_yard.cli("job", "tensorboard", "nosuch").rc == 3
    path = tb_yard.write_job("quiet", {"name": "quiet", "cluster": CLUSTER,
                                       "command": "true", "outputs": {"TB": {}}})
    tb_yard.ok("job", "create", "-f", str(path))
    tb_yard.wait_job("quiet", timeout=60)
    none = tb_yard.cli("job", "tensorboard", "quiet")
    assert none.rc == 3 and "no TensorBoard event files" in none.stderr, str(none)
    _job(tb_yard, "some", steps=2, pause=0.0)
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = tb_yard.cli("job", "tensorboard", "some", "--port",
                           str(taken.getsockname()[1]))
    assert busy.rc == 2 and "--port" in busy.stderr, str(busy)
    assert tb_yard.cli("job", "tensorboard", "some", "--output", "../x").rc == 2
    assert tb_yard.cli("job", "tensorboard", "some", "some").rc == 2
    assert "Traceback" not in busy.stderr + none.stderr


def test_no_tensorboard_outlives_the_command(tb_yard: Yard) -> None:
    _job(tb_yard, "orphan", steps=2, pause=0.0)
    for how in (signal.SIGTERM, signal.SIGKILL):
        board = Board(tb_yard, "orphan")
        assert _boards_left(tb_yard)
        board.proc.send_signal(how)
        board.proc.wait(timeout=30)
        assert board.proc.returncode == (130 if how == signal.SIGTERM else -9)
        wait_until(lambda: not _boards_left(tb_yard), 20, 0.2,
                   f"TensorBoard to be gone after {how.name}")
