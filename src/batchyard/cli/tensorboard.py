"""`batchyard job tensorboard JOB [JOB...] [--output ID] [--port P]`: the real TensorBoard on
the jobs' event files. Their TensorBoard files (``*tfevents*``, ``plugins/``) are copied from
the server's copy of the outputs (which running jobs send every 30 s) into
``$BATCHYARD_HOME/tensorboard/...`` and kept in step while a job runs; TensorBoard serves them
on loopback, one run per job side by side, until Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from batchyard.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    ExperimentOpt,
    WorkspaceOpt,
    client,
    err_console,
    fail,
    handled,
)

if TYPE_CHECKING:
    from batchyard.client.http import Client

SYNC_EVERY = 5.0
START_TIMEOUT = 90.0
DEFAULT_PORT = 6006
TERMINAL = ("succeeded", "failed", "canceled")


class Mirror:
    """One job's TensorBoard files on this machine, in step with the server's copy."""

    def __init__(self, c: Client, path: str, job: dict[str, Any], output: str | None,
                 root: Path) -> None:
        self.c, self.path, self.job, self.output = c, path, job, output
        self.root = root
        self.sizes: dict[str, int] = {}
        self.attempt: int | None = None

    @property
    def logdir(self) -> Path:
        return self.root / self.output if self.output else self.root

    def sync(self) -> int:
        """Copy what is new or changed; the number of files copied."""
        from batchyard.node.event_sync import is_tensorboard_file

        self.job = self.c.get(self.path)
        if not self.job.get("attempts"):
            return 0
        listing = self.c.get(self.path + "/files")
        if listing.get("attempt") != self.attempt:  # a new attempt: its files only
            self.attempt, self.sizes = listing.get("attempt"), {}
            shutil.rmtree(self.root, ignore_errors=True)
        copied = 0
        for entry in listing.get("files") or []:
            parts = str(entry.get("path", "")).split("/")
            if len(parts) < 3 or parts[0] != "outputs" or \
                    (self.output and parts[1] != self.output):
                continue
            rel = "/".join(parts[2:])
            if not is_tensorboard_file(rel) or ".." in parts:
                continue
            key = "/".join(parts[1:])
            if self.sizes.get(key) == entry.get("size"):
                continue
            target = self.root / key
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.part")
            self.c.download(self.path + "/files/content", str(partial), path=entry["path"],
                            attempt=self.attempt)
            os.replace(partial, target)
            self.sizes[key] = int(entry.get("size") or 0)
            copied += 1
        return copied

    @property
    def ended(self) -> bool:
        return self.job.get("state") in TERMINAL


def _free_port(wanted: int | None) -> int:
    for port in ([wanted] if wanted else [DEFAULT_PORT, 0]):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                if wanted:
                    fail(f"--port {wanted}: that port is taken on this machine")
                continue
            return int(sock.getsockname()[1])
    return 0


def _run_name(job: dict[str, Any], duplicated: bool) -> str:
    name = str(job["name"])
    return f"{job.get('experiment')}-{name}" if duplicated else name


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
            fail(f"TensorBoard exited with code {proc.returncode}:\n{tail}", EXIT_ERROR)
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "data/logdir", timeout=2.0).status_code == 200:
                return
        time.sleep(0.3)
    fail(f"TensorBoard did not answer at {url} within {START_TIMEOUT:g}s (its log: {log})",
         EXIT_ERROR)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tensorboard(
    jobs: list[str] = typer.Argument(..., metavar="JOB...", help="One job, or several to "
                                     "show their runs side by side."),
    output: str = typer.Option(None, "--output", metavar="ID", help="The output (its ID) "
                               "that holds the event files; default: every output of the "
                               "job that has some."),
    port: int = typer.Option(None, "--port", help="TensorBoard's port on 127.0.0.1 "
                             f"(default {DEFAULT_PORT}, or a free one)."),
    workspace: str = WorkspaceOpt, experiment: str = ExperimentOpt,
) -> None:
    """Run TensorBoard on jobs' event files and print its URL (Ctrl-C stops it).

    A running job's event files follow as it writes them (every 30 s on the server, every
    5 s here); an ended job's are all there."""
    import importlib.util

    with handled():
        if importlib.util.find_spec("tensorboard") is None:
            fail("TensorBoard is not installed here: pip install 'batchyard[tensorboard]'",
                 EXIT_ERROR)
        if output is not None and not output.replace("_", "").isalnum():
            fail(f"--output {output!r}: an output ID (letters, digits and _)")
        if port is not None and not 0 < port < 65536:
            fail(f"--port {port}: between 1 and 65535")
        from batchyard.cli.job import locate
        from batchyard.config import home

        c = client()
        names = [j.strip() for j in jobs if j.strip()]
        if len(set(names)) != len(names):
            fail("JOB: each job once")
        mirrors: list[Mirror] = []
        for name in names:
            path, found = locate(c, workspace, experiment, name)
            job = found or c.get(path)
            root = home() / "tensorboard" / str(job["workspace"]) / str(job["experiment"]) / \
                str(job["name"])
            mirrors.append(Mirror(c, path, job, output, root))
        _first_sync(mirrors)
        duplicated = len({m.job["name"] for m in mirrors}) < len(mirrors)
        spec = ",".join(f"{_run_name(m.job, duplicated)}:{m.logdir}" for m in mirrors)
        chosen = _free_port(port)
        url = f"http://127.0.0.1:{chosen}/"
        log = home() / "tensorboard" / "tensorboard.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        from batchyard import tensorboard_proc

        with open(log, "ab") as out:  # a child that dies with this command, however it ends
            proc = subprocess.Popen(
                tensorboard_proc.argv(["--logdir_spec", spec, "--host", "127.0.0.1",
                                       "--port", str(chosen), "--reload_interval", "5"]),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        signal.signal(signal.SIGTERM, _interrupted)  # stopped as Ctrl-C stops it
        try:
            _wait_ready(proc, url, log)
            print(url, flush=True)
            err_console.print(f"TensorBoard on {', '.join(names)} at {url} (Ctrl-C stops "
                              "it)", highlight=False, markup=False, soft_wrap=True)
            _follow(mirrors, proc)
        except KeyboardInterrupt:
            _stop(proc)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        finally:
            _stop(proc)
        raise typer.Exit(proc.returncode or 0)


def _interrupted(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _first_sync(mirrors: list[Mirror]) -> None:
    """Copy what there is, waiting until some job has event files; a job that ended without
    any is an error, one still running gets its files as it writes them (``_follow``)."""
    said = False
    while True:
        for mirror in mirrors:
            mirror.sync()
        have = [m for m in mirrors if m.logdir.is_dir() and any(m.logdir.rglob("*tfevents*"))]
        ended = [m for m in mirrors if m.ended and m not in have]
        if ended:
            where = f"outputs/{ended[0].output}/" if ended[0].output else "its outputs"
            fail(f"job {ended[0].job['name']} has no TensorBoard event files in {where} "
                 "(it has ended)", EXIT_NOT_FOUND)
        if have:
            return
        if not said:
            err_console.print("waiting for the jobs to write TensorBoard event files "
                              "(Ctrl-C stops)", highlight=False, markup=False)
            said = True
        time.sleep(SYNC_EVERY)


def _follow(mirrors: list[Mirror], proc: subprocess.Popen[bytes]) -> None:
    """Keep the copies in step until TensorBoard exits (or Ctrl-C)."""
    while proc.poll() is None:
        for mirror in mirrors:
            if not mirror.ended:
                with contextlib.suppress(Exception):  # the server away a moment: next time
                    mirror.sync()
        try:
            proc.wait(timeout=SYNC_EVERY)
        except subprocess.TimeoutExpired:
            continue
