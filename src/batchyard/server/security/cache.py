"""What authentication and authorisation read from the database, kept per server process so
that a request with a known personal token costs no database round trip: the token's user
(by the token's sha256) and that user's roles by workspace.

Changes take effect promptly everywhere:

* in the process that makes one (a token revoked, a user disabled, a role or a team
  changed), every entry is dropped once its transaction has committed;
* the other processes on the same PostgreSQL database (``--workers``, standbys) hear it
  through ``server.bus`` (the ``auth`` message) within milliseconds and drop theirs; a
  process that missed messages (its listening connection dropped) drops everything when it
  listens again (``bump *``);
* whatever happens to those messages, no entry is older than ``TTL`` seconds.

Unknown tokens are never cached (each costs a lookup; failed ones are rate-limited), and
neither are job tokens (their job ending ends them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import Session

from batchyard.server import notify
from batchyard.server.security.principal import Role

TTL = 5.0
MAX_ENTRIES = 10_000
_CHANGED = "auth_changed"
K = TypeVar("K")
V = TypeVar("V")


class TokenOwner(NamedTuple):
    """A personal token and the user it belongs to, as last read."""

    token_id: int
    user_id: int
    name: str
    admin: bool
    service: bool
    user_disabled: bool
    revoked_at: float | None
    expires_at: float | None


class _Table(Generic[K, V]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[K, tuple[float, int, V]] = {}
        self.generation = 0

    def get(self, key: K) -> V | None:
        found = self._rows.get(key)
        if found is None or found[1] != self.generation or time.monotonic() - found[0] > TTL:
            return None
        return found[2]

    def put(self, key: K, value: V, generation: int) -> None:
        """``generation``: the one read before the database was: a change committed
        meanwhile makes the value stale, and it is not kept."""
        with self._lock:
            if generation != self.generation:
                return
            if len(self._rows) >= MAX_ENTRIES:
                self._rows.clear()
            self._rows[key] = (time.monotonic(), generation, value)

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._rows.clear()


tokens: _Table[str, TokenOwner] = _Table()  # by the token's sha256
users: _Table[int, TokenOwner] = _Table()  # by user id (portal sessions; token_id 0)
roles: _Table[int, dict[str, Role]] = _Table()  # by user id
# the principal a known token stands for, and when the token expires (by its sha256)
principals: _Table[str, tuple[Any, float | None]] = _Table()


def invalidate() -> None:
    """Drop everything here (another process changed something, or this one did)."""
    tokens.clear()
    users.clear()
    roles.clear()
    principals.clear()


def changed(session: Session) -> None:
    """Identities or roles change in ``session``'s transaction: once it commits, every
    process forgets what it cached."""
    session.info[_CHANGED] = True
    notify.relay_after_commit(session, "auth")


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    if session.info.pop(_CHANGED, False):
        invalidate()


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop(_CHANGED, None)


def cached(table: _Table[K, V], key: K, load: Callable[[], V | None]) -> V | None:
    """``table[key]``, else ``load()`` kept (None is not kept)."""
    found = table.get(key)
    if found is not None:
        return found
    seen = table.generation
    value = load()
    if value is not None:
        table.put(key, value, seen)
    return value
