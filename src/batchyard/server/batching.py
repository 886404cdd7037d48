"""Submits that arrive together are written together: one worker call, one transaction.

Under a stream of submits every one of them paid for its own trip to a worker thread, its
own session and connection check-out, its own ``BEGIN IMMEDIATE`` and commit, and on SQLite
its own turn at the write lock, where the other submits' threads sat waiting anyway (one
writer). Those costs were more than half of a submit's server CPU. Here a submit queues its work on
the event loop; a drain takes everything queued, runs it in order in one transaction in one
worker call, commits once and answers each.

The answers are the ones the submits would have got one at a time, in that order: each
piece of work sees the writes of those before it, as it would have after their commits.
When one fails, or ends the transaction itself (a rollback that would take the others'
writes with it), the whole batch is rolled back and every piece is run again alone, in its
own transaction, exactly as before batching; the failure then reaches only its own
request. A failed commit is handled the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar, cast

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from batchyard.store.db import Database, begin_write, is_sqlite

T = TypeVar("T")
Work = Callable[[Session], Any]
MAX_BATCH = 64


class _Dirty(Exception):
    """A piece of work failed, or ended the batch's transaction: run each piece alone."""


class WriteBatcher:
    """One drain at a time, on PostgreSQL too: with three at once (writers side by side,
    each waiting on the network by turns) a submit cost more server CPU (2.7-3.3 ms against
    2.2-2.6) and p99 was higher (119-146 ms against 75-87), batches being smaller. Used from
    the event loop only (its queue is not locked)."""

    def __init__(self, db: Database, kick: Callable[[], None]) -> None:
        self.db = db
        self.kick = kick
        self._queue: list[tuple[Work, asyncio.Future[Any]]] = []
        self._drain_task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak one
        self.batches = 0  # how many transactions carried how many pieces (tests, benches)
        self.pieces = 0

    async def run(self, work: Callable[[Session], T]) -> T:
        """``work(session)``'s answer once its transaction has committed, or its error."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append((work, future))
        if self._drain_task is None:  # one drain: it takes whatever queues while it writes
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def run_alone(self, work: Callable[[Session], T]) -> T:
        """``work`` in a transaction of its own, beside the batches: for one that may take long
        before it writes (packing a code directory on the server), which must not hold the
        batch, and on SQLite the write lock, meanwhile."""
        (ok, value), kick = await run_in_threadpool(self._alone, work)
        if kick:
            self.kick()
        if not ok:
            raise value
        return cast(T, value)

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                stopped: BaseException | None = None
                try:
                    outcomes, kick = await run_in_threadpool(self._write, [w for w, _ in batch])
                except BaseException as exc:  # every waiter must be answered
                    outcomes, kick = [(False, exc)] * len(batch), False
                    stopped = exc if isinstance(exc, asyncio.CancelledError) else None
                if kick:
                    self.kick()
                for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                    if future.done():  # the client went away: the job stands all the same
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
                if stopped is not None:  # the server is stopping: the rest are answered so
                    for _, future in self._queue:
                        if not future.done():
                            future.set_exception(stopped)
                    self._queue = []
                    raise stopped
        finally:
            self._drain_task = None

    def _write(self, pieces: list[Work]) -> tuple[list[tuple[bool, Any]], bool]:
        """(each piece's (ok, answer or error), whether a commit asked for a reconciler
        pass)."""
        if len(pieces) > 1:
            try:
                return self._together(pieces)
            except _Dirty:
                pass
            except Exception as exc:  # no transaction to write in (the write lock, the
                # connection): each alone would wait for it in turn and meet the same
                return [(False, exc)] * len(pieces), False
        outcomes = [self._alone(piece) for piece in pieces]
        return [o for o, _ in outcomes], any(k for _, k in outcomes)

    def _together(self, pieces: list[Work]) -> tuple[list[tuple[bool, Any]], bool]:
        session = self.db.open_session()
        try:
            if is_sqlite(session):
                begin_write(session)  # the lock once, for all of them
            else:
                session.connection()
        except BaseException:
            session.rollback()
            session.close()
            raise
        try:
            transaction = session.get_transaction()
            answers = []
            for piece in pieces:
                try:
                    answers.append((True, piece(session)))
                except Exception:
                    raise _Dirty from None
                if session.get_transaction() is not transaction:
                    raise _Dirty  # it rolled back: the pieces before it lost their writes
            session.commit()
        except BaseException as exc:
            session.rollback()
            if isinstance(exc, Exception) and not isinstance(exc, _Dirty):
                raise _Dirty from exc  # the commit failed: let each piece meet it alone
            raise
        finally:
            session.close()
        self.batches += 1
        self.pieces += len(pieces)
        return answers, bool(session.info.get("kick"))

    def _alone(self, piece: Work) -> tuple[tuple[bool, Any], bool]:
        try:
            with self.db.session() as session:  # committed, or rolled back on any error
                answer = piece(session)
        except Exception as exc:
            return (False, exc), False
        return (True, answer), bool(session.info.get("kick"))
