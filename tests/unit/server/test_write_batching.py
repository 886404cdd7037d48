"""Submits written together (server/batching.py): one transaction for the pieces queued at
the same moment, and each answer the one it would have got alone, on a real SQLite store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from batchyard.errors import Conflict, NotFound
from batchyard.server.batching import WriteBatcher
from batchyard.server.context import ServerContext, kick_after_commit
from batchyard.server.services import jobs
from batchyard.spec.job import JobSpec
from batchyard.store.db import Database
from batchyard.store.models import Cluster, Event, Experiment, Job, Workspace


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    return database


def _names(db: Database) -> list[str]:
    with db.session() as s:
        return sorted(s.scalars(select(Workspace.name)))


def _make(name: str) -> Callable[[Session], str]:
    def piece(s: Session) -> str:
        if s.scalar(select(Workspace.id).where(Workspace.name == name)) is not None:
            raise Conflict(f"workspace {name!r} exists")
        s.add(Workspace(name=name))
        s.flush()
        return name

    return piece


async def _all(batcher: WriteBatcher, pieces: list[Callable[[Session], Any]]
               ) -> list[Any]:
    return await asyncio.gather(*(batcher.run(p) for p in pieces), return_exceptions=True)


def test_pieces_queued_together_commit_in_one_transaction(db: Database) -> None:
    kicks: list[int] = []
    batcher = WriteBatcher(db, lambda: kicks.append(1))

    def kicking(s: Session) -> str:
        kick_after_commit(s)
        return _make("k")(s)

    answers = asyncio.run(_all(batcher, [_make(f"w{i}") for i in range(10)] + [kicking]))
    assert answers == [f"w{i}" for i in range(10)] + ["k"]
    assert (batcher.batches, batcher.pieces) == (1, 11)
    assert _names(db) == sorted([f"w{i}" for i in range(10)] + ["k"])
    assert kicks == [1]


def test_a_piece_sees_the_writes_of_those_before_it(db: Database) -> None:
    batcher = WriteBatcher(db, lambda: None)
    answers = asyncio.run(_all(batcher, [_make("a"), _make("a"), _make("b")]))
    assert answers[0] == "a" and answers[2] == "b"
    assert isinstance(answers[1], Conflict)  # as if the first had committed alone
    assert _names(db) == ["a", "b"]


def test_a_failing_piece_fails_alone_and_keeps_nothing_it_wrote(db: Database) -> None:
    batcher = WriteBatcher(db, lambda: None)

    def half(s: Session) -> str:
        s.add(Workspace(name="half"))
        s.flush()
        raise RuntimeError("broke after writing")

    answers = asyncio.run(_all(batcher, [_make("a"), half, _make("b")]))
    assert answers[0] == "a" and answers[2] == "b"
    assert isinstance(answers[1], RuntimeError)
    assert _names(db) == ["a", "b"]  # not "half": its own transaction was rolled back
    assert batcher.batches == 0  # the batch was undone and each piece run alone


def test_a_piece_that_rolls_back_cannot_take_the_others_writes(db: Database) -> None:
    batcher = WriteBatcher(db, lambda: None)

    def undo_then_write(s: Session) -> str:
        s.rollback()  # e.g. a replayed idempotent submit on PostgreSQL
        return _make("c")(s)

    answers = asyncio.run(_all(batcher, [_make("a"), undo_then_write, _make("b")]))
    assert answers == ["a", "c", "b"]
    assert _names(db) == ["a", "b", "c"]


def test_a_client_gone_before_the_answer_still_gets_its_write(db: Database) -> None:
    batcher = WriteBatcher(db, lambda: None)

    async def main() -> None:
        gone = asyncio.ensure_future(batcher.run(_make("gone")))
        stays = asyncio.ensure_future(batcher.run(_make("stays")))
        await asyncio.sleep(0)
        gone.cancel()
        assert await stays == "stays"

    asyncio.run(main())
    assert _names(db) == ["gone", "stays"]


@pytest.fixture
def cluster(db: Database) -> str:
    with db.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        s.add(Cluster(workspace_id=ws.id, name="c0", backend="local", spec={},
                      size={"vcpus": 2}, target_nodes=1))
    return "c0"


def _submit(db: Database, name: str) -> Callable[[Session], str]:
    ctx = ServerContext(db=db, admin_token="unused")
    spec = JobSpec.model_validate({"command": "true"})

    def piece(s: Session) -> str:
        return str(jobs.submit(ctx, s, "default", spec, cluster="c0", experiment="e",
                               name=name)["name"])

    return piece


def test_submits_written_together_read_their_cluster_once(db: Database, cluster: str) -> None:
    reads: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM workspaces" in statement:
            reads.append(statement)

    event.listen(db.engine, "before_cursor_execute", seen)
    batcher = WriteBatcher(db, lambda: None)
    answers = asyncio.run(_all(batcher, [_submit(db, f"j{i}") for i in range(8)]))
    assert answers == [f"j{i}" for i in range(8)]
    assert (batcher.batches, batcher.pieces) == (1, 8)
    assert len(reads) == 1, reads


def test_a_cluster_read_in_one_transaction_is_read_again_in_the_next(
        db: Database, cluster: str) -> None:
    """A session that outlives its transaction does not keep what it read there: a
    cluster deleted meanwhile is not submitted to."""
    session = db.open_session()
    try:
        session.execute(select(1))  # begun, as a batch's transaction is before its pieces
        assert _submit(db, "before")(session) == "before"
        session.commit()
        with db.session() as other:
            found = other.scalar(select(Cluster).where(Cluster.name == cluster))
            assert found is not None
            found.deleting = True
        session.execute(select(1))
        with pytest.raises(NotFound):
            _submit(db, "after")(session)
    finally:
        session.rollback()
        session.close()


def test_no_write_lock_for_the_batch_answers_each_piece_at_once(db: Database) -> None:
    """A batch that cannot begin (the write lock held past its wait) answers every piece
    with that error once, rather than each waiting for it again in turn."""
    from batchyard.store import db as store_db

    lock = store_db.write_lock_for(str(db.engine.url.database))
    holder = db.open_session()
    store_db.begin_write(holder)  # another writer holds the database
    waits: list[float] = []
    real_acquire = lock.acquire

    def short(timeout: float) -> bool:
        waits.append(timeout)
        return real_acquire(0.2)

    lock.acquire = short  # type: ignore[method-assign]
    try:
        batcher = WriteBatcher(db, lambda: None)
        answers = asyncio.run(_all(batcher, [_make(f"w{i}") for i in range(5)]))
    finally:
        lock.acquire = real_acquire  # type: ignore[method-assign]
        holder.rollback()
        holder.close()
    assert all("database is locked" in str(a) for a in answers), answers
    assert len(waits) == 1
    assert _names(db) == []


def test_submits_written_together_read_their_experiment_once(db: Database,
                                                             cluster: str) -> None:
    reads: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM experiments" in statement:
            reads.append(statement)

    with db.session() as s:
        s.add(Experiment(workspace_id=s.scalar(select(Workspace.id)), name="e"))
    event.listen(db.engine, "before_cursor_execute", seen)
    batcher = WriteBatcher(db, lambda: None)
    answers = asyncio.run(_all(batcher, [_submit(db, f"j{i}") for i in range(8)]))
    assert answers == [f"j{i}" for i in range(8)]
    assert len(reads) == 1, reads


def test_a_name_taken_in_the_same_transaction_is_a_conflict(db: Database,
                                                            cluster: str) -> None:
    """With the experiment already read, the job's INSERT decides whether the name is
    taken: the same Conflict as the check before it, nothing written twice."""
    with db.session() as s:
        assert _submit(db, "twice")(s) == "twice"
        with pytest.raises(Conflict, match="'twice' already exists in experiment 'e'"):
            _submit(db, "twice")(s)
        assert _submit(db, "once")(s) == "once"
    batcher = WriteBatcher(db, lambda: None)
    answers = asyncio.run(_all(batcher, [_submit(db, "a"), _submit(db, "once"),
                                         _submit(db, "b")]))
    assert answers[0] == "a" and answers[2] == "b"
    assert isinstance(answers[1], Conflict)
    with db.session() as s:
        names = sorted(s.scalars(select(Job.name)))
        events = s.scalars(select(Event.entity_id).where(Event.kind == "job")).all()
    assert names == ["a", "b", "once", "twice"]
    assert len(events) == 4  # one `submitted` event each


def test_work_run_alone_does_not_hold_the_batches(db: Database) -> None:
    """A piece that is slow before it writes (a code directory packed on the server) runs
    beside the batches: they commit while it works."""
    import threading

    release = threading.Event()
    batcher = WriteBatcher(db, lambda: None)

    def slow(s: Session) -> str:
        assert release.wait(10), "the batches never got through"
        return _make("slow")(s)

    async def main() -> list[Any]:
        alone = asyncio.ensure_future(batcher.run_alone(slow))
        await asyncio.sleep(0.05)
        quick = await _all(batcher, [_make("a"), _make("b")])
        assert not alone.done()
        release.set()
        return [*quick, await alone]

    assert asyncio.run(main()) == ["a", "b", "slow"]
    assert _names(db) == ["a", "b", "slow"]
