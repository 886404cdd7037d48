"""SQLite writes are serialised in the process on purpose (store.db): one writer at a time,
first come first served, the lock given back whenever the transaction ends, readers never
waiting for it. On a real SQLite file, with real threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from batchyard.store.db import Database, WriteLock, begin_write, write_lock_for
from batchyard.store.models import Experiment, Workspace

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    with database.session() as s:
        s.add(Workspace(name="default"))
    return database


def lock_of(db: Database) -> WriteLock:
    return write_lock_for(db.url.split(":///", 1)[1])


def test_fifo_lock_serves_waiters_in_arrival_order() -> None:
    lock = WriteLock()
    assert lock.acquire(1)
    order: list[int] = []
    threads = []
    def take(i: int) -> None:
        assert lock.acquire(10)
        order.append(i)
        lock.release()

    for i in range(5):
        t = threading.Thread(target=take, args=(i,))
        t.start()
        threads.append(t)
        time.sleep(0.05)  # each one queued before the next arrives
    lock.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3, 4]
    assert lock.acquire(0.1)  # free again
    lock.release()


def test_a_wait_that_runs_out_leaves_the_lock_consistent() -> None:
    lock = WriteLock()
    assert lock.acquire(1)
    assert not lock.acquire(0.05)
    lock.release()
    assert lock.acquire(0.05)
    lock.release()


def test_concurrent_check_then_insert_never_fails(db: Database) -> None:
    """Many threads create the same experiment if missing, plus one row each: no 'database is
    locked', no UNIQUE failure, every row there exactly once."""
    errors: list[str] = []

    def work(i: int) -> None:
        try:
            with db.session() as s:
                ws = s.scalar(select(Workspace))
                assert ws is not None
                begin_write(s)
                if s.scalar(select(Experiment).where(Experiment.name == "shared")) is None:
                    s.add(Experiment(workspace_id=ws.id, name="shared"))
                    s.flush()
                s.add(Experiment(workspace_id=ws.id, name=f"e{i}"))
        except Exception as exc:  # collected and asserted below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(Experiment)) == 61
    assert not lock_of(db)._held


def test_the_lock_is_given_back_on_commit_rollback_and_error(db: Database) -> None:
    lock = lock_of(db)
    with db.session() as s:
        ws = s.scalar(select(Workspace))
        assert ws is not None
        s.add(Experiment(workspace_id=ws.id, name="a"))
        s.flush()
        assert lock._held  # from the first write on
    assert not lock._held  # committed
    with pytest.raises(RuntimeError), db.session() as s:
        s.add(Experiment(workspace_id=ws.id, name="b"))
        s.flush()
        raise RuntimeError("boom")
    assert not lock._held  # rolled back
    with pytest.raises(IntegrityError), db.session() as s:
        s.add(Experiment(workspace_id=ws.id, name="a"))  # duplicate: the statement fails
        s.flush()
    assert not lock._held


def test_readers_do_not_wait_for_the_writer(db: Database) -> None:
    with db.session() as writer:
        ws = writer.scalar(select(Workspace))
        assert ws is not None
        writer.add(Experiment(workspace_id=ws.id, name="pending"))
        writer.flush()
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(_count(db)))
        started = time.monotonic()
        t.start()
        t.join(5)
        assert seen == [0] and time.monotonic() - started < 2  # WAL: the old snapshot
    assert _count(db) == 1


def _count(db: Database) -> int:
    with db.session() as s:
        return int(s.scalar(select(func.count()).select_from(Experiment)) or 0)
