"""The servers of a database, as node launchers reach them (the ``servers`` table).

A launcher knew one address, its ticket's: when that server was killed and a standby took the
lease, or when it came back on another port, the launcher finished its ranks and kept sending
to a dead address, and its job stayed `running` for good. Now every server process writes its
address here while it runs (and which one leads); tickets list them, and each status reply
says which are alive now, so a launcher whose server stops answering finds the one leading."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from batchyard.store.db import Database
from batchyard.store.models import ServerRow, now

log = logging.getLogger("batchyard.server")

SEEN_EVERY = 10.0  # s between refreshes of a server's row
ALIVE_FOR = 60.0  # s: a row not refreshed for this long is a server gone (killed -9)
CACHE_FOR = 5.0  # s a process keeps the list it read (every status reply carries it)
_cache: tuple[float, list[str]] = (float("-inf"), [])
_cache_lock = threading.Lock()


class Registry:
    """This server's row: written at start, refreshed by the reconciler's loop (leading or
    standing by), removed at a clean stop."""

    def __init__(self, db: Database, url: str) -> None:
        self.db = db
        self.url = url.rstrip("/")
        self._beaten = float("-inf")
        self._leading: bool | None = None

    def beat(self, leading: bool) -> None:
        """Refresh the row (at most every SEEN_EVERY s, or at once when leadership moved)."""
        if leading == self._leading and time.monotonic() - self._beaten < SEEN_EVERY:
            return
        try:
            with self.db.session() as session:
                self._write(session, leading)
        except IntegrityError:  # made by another process of this server meanwhile
            with self.db.session() as session:
                self._write(session, leading)
        self._beaten, self._leading = time.monotonic(), leading

    def _write(self, session: Session, leading: bool) -> None:
        row = session.scalar(select(ServerRow).where(ServerRow.url == self.url))
        stamp = now()
        if row is None:
            session.add(ServerRow(url=self.url, pid=os.getpid(), host=socket.gethostname(),
                                  leading=leading, started_at=stamp, seen_at=stamp))
            session.flush()
            return
        row.seen_at, row.pid, row.leading = stamp, os.getpid(), leading

    def leave(self) -> None:
        try:
            with self.db.session() as session:
                session.execute(delete(ServerRow).where(ServerRow.url == self.url))
        except Exception as exc:  # a stop with the database away: the row just ages out
            log.info("could not remove this server from the servers table: %s", exc)


def live_urls(session: Session) -> list[str]:
    """The servers alive now, the leading one first (cached for CACHE_FOR s)."""
    global _cache
    with _cache_lock:
        read_at, urls = _cache
        if time.monotonic() - read_at < CACHE_FOR:
            return list(urls)
    rows = session.execute(select(ServerRow.url, ServerRow.leading).where(
        ServerRow.seen_at >= now() - ALIVE_FOR).order_by(ServerRow.leading.desc(),
                                                         ServerRow.seen_at.desc())).all()
    urls = [str(r[0]) for r in rows]
    with _cache_lock:
        _cache = (time.monotonic(), urls)
    return list(urls)
