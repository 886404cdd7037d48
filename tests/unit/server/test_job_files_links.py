"""A job's files as the server serves them (services.files) never go through a link: a job
on the server's own host (the local backend) can plant links in the server's copies, so every
component from the job's directory down is opened without following one, only regular files
with a single link are read, listed or followed, and log lines are cut into bounded pieces
(``\\r`` ends a line too). On a real SQLite store and real files, links and FIFOs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from batchyard.errors import NotFound
from batchyard.server.services import files, logs
from batchyard.store.db import Database
from batchyard.store.models import Attempt, Cluster, Experiment, Job, Workspace

pytestmark = pytest.mark.timeout(60)
SECRET = b"the-admin-token\n"


@pytest.fixture
def yard(tmp_path: Path) -> tuple[Database, Path, Path]:
    """(db, attempt dir, a secret file outside the job) for an ended job 'run'."""
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.migrate()
    jobs = tmp_path / "jobs"
    with db.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        c = Cluster(workspace_id=ws.id, name="c", backend="local", spec={}, size={"vcpus": 2},
                    target_nodes=1)
        exp = Experiment(workspace_id=ws.id, name="default")
        s.add_all([c, exp])
        s.flush()
        job = Job(workspace_id=ws.id, experiment_id=exp.id, cluster_id=c.id, name="run",
                  spec={"command": "true"}, directory=str(jobs / "run"), state="succeeded",
                  attempt=1)
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, number=1, uuid="u-1", state="succeeded", node_ids=[],
                      handle={"node_names": ["c-0"]}, directory=str(jobs / "run" / "u-1")))
    attempt = jobs / "run" / "u-1"
    (attempt / "stdouterr").mkdir(parents=True)
    (attempt / "outputs" / "RESULT").mkdir(parents=True)
    secret = tmp_path / "token"
    secret.write_bytes(SECRET)
    return db, attempt, secret


def read_logs(db: Database, **kw: Any) -> bytes:
    async def main() -> bytes:
        first, rest = await logs.open_follow(db, "default", "default", "run", **kw)
        return first + b"".join([chunk async for chunk in rest])

    return asyncio.run(asyncio.wait_for(main(), 20))


def portal_logs(db: Database) -> bytes:
    return b"".join(files.follow(db, "default", "default", "run", node=None, rank=None,
                                 stream="all", attempt=None, follow_=False, prefix=True))


def listed(db: Database) -> list[str]:
    with db.session() as s:
        return [f["path"] for f in files.list_files(s, "default", "default", "run")["files"]]


def download(db: Database, rel: str) -> bytes:
    with db.session() as s:
        found = files.open_download(s, "default", "default", "run", rel)
    try:
        return os.read(found.fd, found.size + 1)
    finally:
        os.close(found.fd)


def test_a_rank_log_linked_to_a_secret_is_neither_read_nor_listed(yard) -> None:
    db, attempt, secret = yard
    log_dir = attempt / "stdouterr"
    (log_dir / "c-0-rank0.stdout.txt").write_bytes(b"hello\n")
    (log_dir / "c-0-rank7.stdout.txt").symlink_to(secret)
    os.link(secret, log_dir / "c-0-rank6.stdout.txt")  # a hard link to it: not the job's
    os.mkfifo(log_dir / "c-0-rank5.stdout.txt")  # opening it would block a reader
    (log_dir / "c-0-rank4.stdout.txt").symlink_to("/dev/zero")
    for kw in ({"rank": 7}, {"rank": 6}, {"rank": 5}, {"rank": 4}, {}):
        out = read_logs(db, **kw)
        assert SECRET.strip() not in out and b"\0" not in out, kw
    assert read_logs(db, rank=0) == b"hello\n"
    assert SECRET.strip() not in portal_logs(db)
    assert listed(db) == ["stdouterr/c-0-rank0.stdout.txt"]
    for rank in (4, 5, 6, 7):
        with pytest.raises(NotFound):
            download(db, f"stdouterr/c-0-rank{rank}.stdout.txt")
    assert download(db, "stdouterr/c-0-rank0.stdout.txt") == b"hello\n"


def test_a_linked_directory_anywhere_in_the_job_is_not_followed(yard, tmp_path: Path) -> None:
    db, attempt, secret = yard
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "c-0-rank0.stdout.txt").write_bytes(SECRET)
    (elsewhere / "token").write_bytes(SECRET)
    result = attempt / "outputs" / "RESULT"
    (result / "model.txt").write_bytes(b"weights\n")
    (result / "sub").symlink_to(elsewhere)  # a linked directory inside an output
    (result / "link.txt").symlink_to(secret)
    (attempt / "outputs" / "HOME").symlink_to(elsewhere)  # a linked output root
    assert listed(db) == ["outputs/RESULT/model.txt"]
    for rel in ("outputs/RESULT/sub/token", "outputs/RESULT/link.txt", "outputs/HOME/token",
                "outputs/RESULT/../HOME/token", "stdouterr/../../../token"):
        with pytest.raises((NotFound, files.SpecError)):
            download(db, rel)
    assert download(db, "outputs/RESULT/model.txt") == b"weights\n"
    # the log directory itself replaced by a link to a directory of "logs"
    (attempt / "stdouterr").rmdir()
    (attempt / "stdouterr").symlink_to(elsewhere)
    assert read_logs(db) == b"" and portal_logs(db) == b""
    assert listed(db) == ["outputs/RESULT/model.txt"]
    with pytest.raises(NotFound):
        download(db, "stdouterr/c-0-rank0.stdout.txt")
    # and the attempt directory itself
    (attempt / "stdouterr").unlink()
    moved = attempt.with_name("u-1.real")
    attempt.rename(moved)
    attempt.symlink_to(moved)
    assert listed(db) == []
    with pytest.raises(NotFound):
        download(db, "outputs/RESULT/model.txt")


def test_carriage_returns_end_lines_and_nothing_grows_past_max_line() -> None:
    lines, rest = files.split_lines(b"", b"10%\r20%\r30%")
    assert lines == [b"10%", b"20%"] and rest == b"30%"
    lines, rest = files.split_lines(b"a", b"b\r")  # maybe half of \r\n: held
    assert lines == [] and rest == b"ab\r"
    lines, rest = files.split_lines(rest, b"\nc\n")
    assert lines == [b"ab", b"c"] and rest == b""
    lines, rest = files.split_lines(b"", b"x" * (files.MAX_LINE * 3 + 5))
    assert lines == [b"x" * files.MAX_LINE] * 3 and rest == b"x" * 5
    assert files.last_line(b"tail\r") == b"tail" and files.last_line(b"") is None


def test_a_carriage_return_progress_bar_is_read_in_bounded_lines(yard) -> None:
    db, attempt, _secret = yard
    bar = b"".join(b"step %07d [" % i + b"#" * 40 + b"]\r" for i in range(20_000))
    (attempt / "stdouterr" / "c-0-rank0.stdout.txt").write_bytes(bar + b"x" * 200_000)
    for out in (read_logs(db, rank=0, prefix=False), b"".join(
            files.follow(db, "default", "default", "run", node=None, rank=0, stream="all",
                         attempt=None, follow_=False, prefix=False))):
        got = out.split(b"\n")
        assert got[0].startswith(b"step 0000000 [") and len(got) > 20_000
        assert max(len(line) for line in got) <= files.MAX_LINE
        assert b"".join(got[20_000:]) == b"x" * 200_000


def test_dir_under_makes_directories_but_never_through_a_link(yard, tmp_path: Path) -> None:
    _db, attempt, _secret = yard
    fd = files.dir_under(attempt, ["outputs", "NEW", "sub"], create=True)
    os.close(fd)
    assert (attempt / "outputs" / "NEW" / "sub").is_dir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (attempt / "outputs" / "LINKED").symlink_to(elsewhere)
    with pytest.raises(OSError):
        files.dir_under(attempt, ["outputs", "LINKED", "sub"], create=True)
    with pytest.raises(OSError):
        files.dir_under(attempt, ["outputs", ".."], create=True)
    assert list(elsewhere.iterdir()) == []
