"""Which server process runs the reconciler and the sweep driver, when several serve one
PostgreSQL database (a team server with a standby, or two started by mistake): the one
holding a session-level advisory lock on a connection of its own. The others answer the API
and wait; when the leader dies its connection drops, PostgreSQL releases the lock, and the
next to ask takes over.

Being the leader a moment ago is not enough to write a scheduling decision: the leader's
lock connection can break in the middle of a pass, and a standby take over before the pass
commits. Every scheduling transaction therefore fences itself: it takes a transaction-level
advisory lock (so two passes never overlap; the second sees the first's commit) and checks,
inside that transaction, that its own lock connection still holds the lease. A stale leader's
pass rolls back instead of launching a job the new leader launches too.

SQLite needs none of this: one server per home holds the home's lock file (server/main.py)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

LEASE_KEY = 0x62796C64  # "byld": the reconciler's lease
PASS_KEY = 0x62797073  # "byps": one scheduling pass at a time


class LeaseLost(Exception):
    """This server no longer holds the lease: its pass must not commit."""


class Leadership:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.shared = engine.dialect.name == "postgresql"
        self._conn: Any = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._announced: bool | None = None

    def held(self) -> bool:
        """True while this process leads (always, on SQLite). Cheap enough for every tick:
        one round trip on the lease's own connection."""
        if not self.shared:
            return True
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.exec_driver_sql("SELECT 1")
                    return self._say(True)
                except Exception:
                    log.warning("lost the connection holding the reconciler lease")
                    self._drop()
            try:
                conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                                   {"k": LEASE_KEY}).scalar()
                if not got:
                    conn.close()
                    return self._say(False)
                self._conn = conn
                self._pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar() or 0)
                return self._say(True)
            except Exception as exc:
                from batchyard.server import storage_trouble

                storage_trouble.log_once(log, "asking for the reconciler lease failed", exc)
                self._drop()
                return False

    def leads_now(self) -> bool:
        """Whether this process held the lease at its last look (no round trip)."""
        return not self.shared or self._conn is not None

    def fence(self, session: Session) -> None:
        """Call first in a transaction whose commit acts on the leader's behalf."""
        if not self.shared:
            return
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PASS_KEY})
        still = session.execute(text(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid = :pid AND ((classid::bigint << 32) | objid::bigint) = :k"),
            {"pid": self._pid or -1, "k": LEASE_KEY}).first()
        if still is None:
            raise LeaseLost("this server lost the reconciler lease")

    def release(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn, self._pid = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the lease connection failed", exc_info=True)

    def _say(self, leading: bool) -> bool:
        if leading != self._announced:
            log.info("this server %s the reconciler", "runs" if leading else
                     "stands by: another server on this database runs")
            self._announced = leading
        return leading
