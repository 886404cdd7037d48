"""The preemption notice on a node (node/notice.py) with real processes: the signal goes
to the job's processes that catch it and to no other, the notice file turns
batchyard.should_checkpoint() True, and a checkpoint reported after the notice ends the
wait at once. The job-file fields are checked at submit (spec)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from batchyard.node import notice
from batchyard.spec.job import JobSpec

CATCHER = """\
import os, signal, sys, time
import batchyard
signal.signal(signal.SIGUSR1, lambda *_: open(sys.argv[1], "w").write(
    str(batchyard.should_checkpoint())))
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
if sys.argv[2] == "save":
    batchyard.checkpoint_saved(7)
time.sleep(60)
"""
IGNORER = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


def _start(code: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _held(folder: Path) -> int:
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


@pytest.mark.parametrize("save", [True, False])
def test_the_catcher_is_told_the_others_are_left_alone(tmp_path: Path, save: bool) -> None:
    tag = uuid.uuid4().hex
    folder = _held(tmp_path)
    notice.prepare(folder, "n0")
    env = {**os.environ, "BATCHYARD_PROC_TAG": tag,
           "BATCHYARD_PREEMPT_NOTICE": str(notice.notice_path(tmp_path, "n0")),
           "BATCHYARD_CHECKPOINT_MARK": str(notice.mark_path(tmp_path, "n0"))}
    told = tmp_path / "told"
    catcher = _start(CATCHER, env, str(told), "save" if save else "quiet")
    ignorer = _start(IGNORER, env)
    said: list[str] = []
    try:
        began = time.monotonic()
        saved = notice.give(folder, "n0", "SIGUSR1", tag, 4.0, "node n0 was preempted",
                            lambda: True, said.append)
        waited = time.monotonic() - began
        assert told.read_text() == "True"  # the handler saw should_checkpoint() True
        assert ignorer.poll() is None and catcher.poll() is None  # nobody ended by it
        assert "SIGUSR1 to 1 process(es)" in said[0], said
        if save:
            assert saved is not None and saved["step"] == 7, saved
            assert waited < 3.0, waited
        else:
            assert saved is None and waited >= 4.0, waited
    finally:
        for proc in (catcher, ignorer):
            proc.kill()
            proc.wait()


def test_an_earlier_attempts_notice_does_not_warn_the_next(tmp_path: Path) -> None:
    folder = _held(tmp_path)
    notice.notice_path(tmp_path, "n0").write_text("{}")
    notice.mark_path(tmp_path, "n0").write_text('{"at": 1, "step": 3}')
    notice.prepare(folder, "n0")
    assert not notice.notice_path(tmp_path, "n0").exists()
    assert notice.last_mark(folder, "n0") is None
    notice.mark_path(tmp_path, "n0").write_text('{"at": 5.5, "st')  # half written
    assert notice.last_mark(folder, "n0") is None
    notice.mark_path(tmp_path, "n0").write_text('{"at": 5.5, "step": 7}')
    assert notice.last_mark(folder, "n0") == {"at": 5.5, "step": 7}


def test_links_and_fifos_a_job_plants_are_never_followed(tmp_path: Path) -> None:
    """The ranks may write the stdouterr dir: a link in place of the mark (to a secret the
    launcher, root, could read) or of the notice's temporary name (to a file it would
    overwrite), or a FIFO (a read that never returns), leaves the launcher unharmed."""
    folder = _held(tmp_path)
    secret = tmp_path.parent / f"{tmp_path.name}-secret"
    secret.write_text('{"at": 9, "step": 1, "token": "s3cret"}')
    secret.chmod(0o600)
    notice.mark_path(tmp_path, "n0").symlink_to(secret)
    assert notice.last_mark(folder, "n0") is None  # not read through the link
    notice.prepare(folder, "n0")  # the link goes; a plain file of its own takes its place
    assert not notice.mark_path(tmp_path, "n0").is_symlink()
    assert oct(secret.stat().st_mode & 0o777) == "0o600"  # never chmod-ed through a link
    os.unlink(notice.mark_path(tmp_path, "n0"))
    os.mkfifo(notice.mark_path(tmp_path, "n0"))
    began = time.monotonic()
    assert notice.last_mark(folder, "n0") is None
    assert time.monotonic() - began < 1.0
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("keep")
    for pid in range(os.getpid() - 5, os.getpid() + 5):  # the old, guessable temporary names
        (tmp_path / f"..preempt-notice-n0.{pid}.tmp").symlink_to(victim)
    saved = notice.give(folder, "n0", "none", uuid.uuid4().hex, 0.2, "preempted",
                        lambda: True, lambda _: None)
    assert saved is None and victim.read_text() == "keep"
    assert json.loads(notice.notice_path(tmp_path, "n0").read_text())["message"] == "preempted"


@pytest.mark.parametrize(("given", "kept"), [("SIGUSR1", "SIGUSR1"), ("USR2", "SIGUSR2"),
                                             ("sigint", "SIGINT"), ("none", "none")])
def test_signal_names(given: str, kept: str) -> None:
    spec = JobSpec.model_validate({"command": "true", "limits": {"checkpoint_signal": given,
                                                                 "checkpoint_notice": "2m"}})
    assert spec.limits.checkpoint_signal == kept
    assert spec.limits.checkpoint_notice == 120.0


def test_defaults() -> None:
    limits = JobSpec.model_validate({"command": "true"}).limits
    assert (limits.checkpoint_signal, limits.checkpoint_notice) == ("SIGUSR1", 60.0)


@pytest.mark.parametrize("limits", [{"checkpoint_signal": "SIGBOGUS"},
                                    {"checkpoint_signal": "KILL"},
                                    {"checkpoint_signal": 10},
                                    {"checkpoint_notice": -1},
                                    {"checkpoint_notice": "-30s"}])
def test_bad_settings_name_the_field(limits: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate({"command": "true", "limits": limits})
    assert next(iter(limits)) in str(caught.value)
