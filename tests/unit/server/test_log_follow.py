"""`job logs -f` as coroutines (services.logs): lines arrive on the log signal, a follower
holds no thread, a long line goes out in bounded pieces, a big log is read whole in bounded
passes, and the stream ends once the job has. On a real SQLite store and real files."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from batchyard.errors import NotFound
from batchyard.server import notify
from batchyard.server.services import logs
from batchyard.store.db import Database
from batchyard.store.models import Attempt, Cluster, Experiment, Job, Workspace

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Database, Path]:
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.migrate()
    with db.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        c = Cluster(workspace_id=ws.id, name="c", backend="local", spec={}, size={"vcpus": 2},
                    target_nodes=1)
        exp = Experiment(workspace_id=ws.id, name="default")
        s.add_all([c, exp])
        s.flush()
        for name in ("run", "wait"):
            s.add(Job(workspace_id=ws.id, experiment_id=exp.id, cluster_id=c.id, name=name,
                      spec={"command": "true"}, directory=str(tmp_path / name),
                      state="running" if name == "run" else "queued",
                      attempt=1 if name == "run" else 0))
        s.flush()
        job = s.query(Job).filter_by(name="run").one()
        s.add(Attempt(job_id=job.id, number=1, uuid="u-1", state="running", node_ids=[],
                      handle={"node_names": ["c-0"]}, directory=str(tmp_path / "run" / "u-1")))
    root = tmp_path / "run" / "u-1" / "stdouterr"
    root.mkdir(parents=True)
    return db, root


def set_state(db: Database, name: str, state: str) -> None:
    with db.session() as s:
        s.query(Job).filter_by(name=name).one().state = state


async def next_chunk(stream: AsyncIterator[bytes], timeout: float = 5.0) -> bytes:
    return await asyncio.wait_for(stream.__anext__(), timeout)


def test_lines_arrive_on_the_signal_and_the_stream_ends_with_the_job(
        setup: tuple[Database, Path]) -> None:
    db, root = setup
    out = root / "c-0-rank0.stdout.txt"
    out.write_bytes(b"first\n")

    async def main() -> None:
        threads = threading.active_count()
        first, rest = await logs.open_follow(db, "default", "default", "run", follow=True)
        assert first == b"[c-0/rank0] first\n"
        with out.open("ab") as fh:
            fh.write(b"second\npart")
        notify.logs_arrived()
        assert await next_chunk(rest) == b"[c-0/rank0] second\n"
        err = root / "c-0-rank0.stderr.txt"  # a new file shows up too
        err.write_bytes(b"oops\n")
        notify.logs_arrived()
        assert await next_chunk(rest) == b"[c-0/rank0:err] oops\n"
        assert threading.active_count() <= threads + logs.WORKERS  # no thread per follower
        set_state(db, "run", "succeeded")
        tail = b""
        async for chunk in rest:  # ends by itself, the partial line flushed
            tail += chunk
        assert tail == b"[c-0/rank0] part\n"

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_queued_job_is_followed_until_it_ends(setup: tuple[Database, Path]) -> None:
    db, _root = setup

    async def main() -> None:
        first, rest = await logs.open_follow(db, "default", "default", "wait", follow=True)
        assert first == b""
        task = asyncio.ensure_future(rest.__anext__())
        await asyncio.sleep(0.5)
        assert not task.done()  # waiting, quietly
        set_state(db, "wait", "canceled")
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(task, 5)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_long_line_goes_out_in_bounded_pieces(setup: tuple[Database, Path]) -> None:
    db, root = setup
    line = b"x" * (logs.MAX_LINE * 3 + 10)
    (root / "c-0-rank0.stdout.txt").write_bytes(line + b"\nend\n")

    async def main() -> list[bytes]:
        first, rest = await logs.open_follow(db, "default", "default", "run", prefix=False)
        return [first] + [chunk async for chunk in rest]

    text = b"".join(asyncio.run(main()))
    pieces = text.split(b"\n")
    assert max(len(p) for p in pieces) <= logs.MAX_LINE
    assert b"".join(pieces[:-2]) == line and pieces[-2:] == [b"end", b""]


def test_a_big_log_is_read_whole_without_follow(setup: tuple[Database, Path]) -> None:
    db, root = setup
    lines = [f"line {i:07d}".encode() for i in range(200_000)]  # ~2.4 MB: many passes
    (root / "c-0-rank0.stdout.txt").write_bytes(b"\n".join(lines) + b"\n")

    async def main() -> list[bytes]:
        first, rest = await logs.open_follow(db, "default", "default", "run", rank=0)
        assert len(first) <= logs.PASS_BUDGET + logs.MAX_LINE + 64
        return [first] + [chunk async for chunk in rest]

    chunks = asyncio.run(main())
    assert b"".join(chunks).split(b"\n")[:-1] == lines
    assert max(len(c) for c in chunks) <= logs.PASS_BUDGET * 2


def test_errors_come_before_the_stream(setup: tuple[Database, Path]) -> None:
    db, _root = setup

    async def main() -> None:
        with pytest.raises(NotFound):
            await logs.open_follow(db, "default", "default", "nope", follow=True)
        with pytest.raises(NotFound):  # not started, and not followed: nothing to show
            await logs.open_follow(db, "default", "default", "wait")

    asyncio.run(main())
