"""Engine and session set-up. SQLite runs in WAL mode with a busy timeout so the API threads
and the reconciler thread can share one file; any other SQLAlchemy URL (PostgreSQL) works.

SQLite has one writer at a time. Left to itself, every other writer of the process sleeps in
SQLite's busy handler (polling with growing sleeps, first come not first served): under load
a submit waited seconds for its first INSERT, and some timed out with ``database is locked``.
So writes are serialised on purpose, in the process: a connection takes a process-wide FIFO
lock (one per database file) before its first write statement (or a SAVEPOINT that opens
its transaction) and gives it back when its transaction ends (commit, rollback, close).
Writers queue in arrival order and wake the moment the one ahead commits; SQLite's own lock
is then always free for them. Readers never take the lock (WAL lets them read beside the
writer). ``begin_write`` opens a write transaction up
front (``BEGIN IMMEDIATE``) for a read-check-then-insert that must be atomic. PostgreSQL needs
none of this and gets none of it.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"
BUSY_TIMEOUT = 30.0  # seconds: SQLite's busy timeout and the longest wait for the write lock
log = logging.getLogger("batchyard.store")

_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|"
                    r"BEGIN\s+(IMMEDIATE|EXCLUSIVE))\b", re.IGNORECASE)
# A SAVEPOINT outside a transaction begins one (deferred): its reads share one snapshot, and
# a write after another connection's commit would fail at once with 'database is locked'
# (SQLITE_BUSY_SNAPSHOT, no busy wait), so it takes the lock like a write.
_SAVEPOINT = re.compile(r"^\s*SAVEPOINT\b", re.IGNORECASE)


class WriteLock:
    """A FIFO lock: waiters are served in arrival order (``threading.Lock`` is not fair),
    and a release hands the lock straight to the next waiter."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiters: deque[threading.Lock] = deque()
        self.owner: int | None = None  # thread ident of the holder, for re-entry checks

    def acquire(self, timeout: float) -> bool:
        with self._mutex:
            if not self._held:
                self._held = True
                self.owner = threading.get_ident()
                return True
            waiter = threading.Lock()
            waiter.acquire()
            self._waiters.append(waiter)
        if not waiter.acquire(timeout=timeout):
            with self._mutex:
                try:
                    self._waiters.remove(waiter)
                except ValueError:  # handed over just as the wait ran out: it is ours
                    pass
                else:
                    return False
        self.owner = threading.get_ident()
        return True

    def release(self) -> None:
        with self._mutex:
            self.owner = None
            if self._waiters:
                self._waiters.popleft().release()  # still held: now by that waiter
            else:
                self._held = False


_locks: dict[str, WriteLock] = {}
_locks_mutex = threading.Lock()


def write_lock_for(path: str) -> WriteLock:
    with _locks_mutex:
        return _locks.setdefault(path, WriteLock())


class _Cursor(sqlite3.Cursor):
    connection: _SerialisedConnection

    def execute(self, sql: str, parameters: Any = (), /) -> _Cursor:
        conn = self.connection
        conn._before(sql)
        try:
            super().execute(sql, parameters)
        finally:
            conn._after()
        return self

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> _Cursor:
        conn = self.connection
        conn._before(sql)
        try:
            super().executemany(sql, seq_of_parameters)
        finally:
            conn._after()
        return self


class _SerialisedConnection(sqlite3.Connection):
    """A pysqlite connection that holds its database's ``WriteLock`` from its first write
    statement to the end of that transaction. Subclassed per database file (``_lock``)."""

    _lock: WriteLock

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._holds = False

    def cursor(self, factory: Any = None) -> Any:
        return super().cursor(factory or _Cursor)

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> Any:
        return self.cursor().executemany(sql, parameters)

    def _before(self, sql: str) -> None:
        if self._holds or not (_WRITE.match(sql) or (
                not self.in_transaction and _SAVEPOINT.match(sql))):
            return
        lock = self._lock
        if lock.owner == threading.get_ident():
            return  # this thread already writes through another connection: waiting for
            # ourselves would only time out; SQLite's busy handling decides, as it always did
        started = time.monotonic()
        if not lock.acquire(BUSY_TIMEOUT):
            raise sqlite3.OperationalError(
                f"database is locked (waited {BUSY_TIMEOUT:.0f} s for the writer ahead)")
        waited = time.monotonic() - started
        if waited > 5:
            log.warning("waited %.1f s for the database's write lock", waited)
        self._holds = True

    def _after(self) -> None:
        if self._holds and not self.in_transaction:  # autocommit, or rolled back by error
            self._release()

    def _release(self) -> None:
        if self._holds:
            self._holds = False
            self._lock.release()

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            if not self.in_transaction:
                self._release()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._release()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release()


def _sqlite_path(url: str) -> str:
    return url.split(":///", 1)[1] if ":///" in url else url


def connection_class(url: str) -> type[sqlite3.Connection]:
    """The pysqlite connection class for ``url``: serialised on that file's ``WriteLock``
    (an in-memory database gets a lock of its own per engine)."""
    path = _sqlite_path(url)
    lock = WriteLock() if path in ("", ":memory:") else write_lock_for(path)
    return type("SerialisedConnection", (_SerialisedConnection,), {"_lock": lock})


MIGRATION_LOCK = 0x62796D67  # PostgreSQL advisory lock keys ("bymg")


def normal_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 here (SQLAlchemy's default driver is psycopg2)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def make_engine(url: str) -> Engine:
    url = normal_url(url)
    kwargs: dict[str, Any] = {"future": True}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": BUSY_TIMEOUT,
                                  "factory": connection_class(url)}
        # A connection per API worker thread (40) and the reconciler's, kept: an overflow
        # connection is closed when given back, and under load every request opened one (a
        # new SQLite connection reads the whole schema again at its first statement: ~40 %
        # of the server's CPU per submit at 16 clients). Connections are made on demand,
        # so an idle server holds only the few it used.
        kwargs["pool_size"] = 48
        kwargs["max_overflow"] = 16
    else:  # the same on PostgreSQL, where a connection is a backend process of its own
        kwargs["pool_pre_ping"] = True
        kwargs["pool_size"] = 48
        kwargs["max_overflow"] = 16
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")
            cur.close()

    return engine


def is_sqlite(session: Session) -> bool:
    return session.get_bind().dialect.name == "sqlite"


def begin_write(session: Session) -> None:
    """Make the rest of this transaction a write transaction now: on SQLite, take the write
    lock and ``BEGIN IMMEDIATE`` (what is read from here on cannot change under us before
    the commit: check-then-insert is atomic). No-op when it already writes, and on other
    databases (PostgreSQL handles concurrent writers itself; callers keep their unique
    constraints as the last word there)."""
    if not is_sqlite(session):
        return
    session.flush()  # else the BEGIN below would autoflush pending writes, which begin first
    raw = session.connection().connection.dbapi_connection
    if isinstance(raw, sqlite3.Connection) and raw.in_transaction:
        return
    session.execute(text("BEGIN IMMEDIATE"))


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (the only way tables get created)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":  # servers starting together migrate in turn
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class Database:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)

    def migrate(self) -> None:
        upgrade(self.engine)

    def open_session(self) -> Session:
        """A session to end yourself (commit or roll back, then close); ``session()`` is the
        usual way. Opening one does not touch the database: it connects at its first
        statement."""
        return self._factory()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        with self._factory() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise
