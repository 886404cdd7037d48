"""Wake-ups for the node channel's long polls. Every change a launcher must hear of (cancel,
abort, finish, a relay exec, a rendezvous, an exec's exit) bumps a counter per attempt; a long
poll sleeps until its attempt's counter moves, then re-reads the database. The counters are
only a hint (a restarted server starts at zero): the database is the truth.

Log arrivals are one signal for all attempts (``logs_arrived``): threads wait on a condition,
event loops subscribe a callback (``on_logs``; services.logs hangs its followers off it).

Several server processes on one PostgreSQL database (``--workers``, or a standby) hear each
other's wake-ups through ``server.bus``: it installs itself as the ``relay`` here, and hands
what other processes announce to ``deliver``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable

from sqlalchemy import event
from sqlalchemy.orm import Session

_lock = threading.Lock()
_versions: dict[str, int] = {}
# The long polls waiting on each key: a bump wakes them on their loop. (They polled every
# 5 ms: 1,000 agents' waiting heartbeats were 200,000 wake-ups a second, bench/fleet_sim.py.)
_waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
LOCAL_KEYS = ("exec-",)  # an exec session lives in one process: its wake-ups stay there
_relay: Callable[[str], None] | None = None
_epoch = 0  # moves every key's version at once
_AFTER_COMMIT = "relay_after_commit"


def set_relay(relay: Callable[[str], None] | None) -> None:
    global _relay
    _relay = relay


def relay(message: str) -> None:
    """Tell the other server processes (if any): ``kick``, ``bump KEY``, ``logs``,
    ``dirty JOB_ID``, ``follow a<ATTEMPT_ID>|j<JOB_ID>|*`` (server/followups.py), ``auth``
    (identities or roles changed: forget what was cached)."""
    if _relay is not None:
        _relay(message)


def relay_after_commit(session: Session, message: str) -> None:
    """``relay`` once ``session``'s transaction has committed: another process that looked
    sooner would read the row as it was, and not look again."""
    if _relay is not None:
        session.info.setdefault(_AFTER_COMMIT, set()).add(message)


@event.listens_for(Session, "after_commit")
def _relay_committed(session: Session) -> None:
    for message in session.info.pop(_AFTER_COMMIT, ()):
        relay(message)


@event.listens_for(Session, "after_rollback")
def _forget_rolled_back(session: Session) -> None:
    session.info.pop(_AFTER_COMMIT, None)


def bump(key: str, session: Session | None = None) -> None:
    """Wake this key's long polls here now, and in the other server processes now or, given
    the ``session`` whose transaction made the change, once it has committed."""
    _bump_here(key)
    if key.startswith(LOCAL_KEYS):
        return
    if session is not None:
        relay_after_commit(session, f"bump {key}")
    else:
        relay(f"bump {key}")


def _bump_here(key: str) -> None:
    with _lock:
        _versions[key] = _versions.get(key, 0) + 1
        waiting: Iterable[_Waiter] = _waiters.pop(key, ())
    _wake(waiting)


_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


def _wake(waiting: Iterable[_Waiter]) -> None:
    for loop, future in waiting:
        with contextlib.suppress(RuntimeError):  # that loop has closed
            loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def version(key: str) -> int:
    with _lock:
        return _versions.get(key, 0) + _epoch


async def wait_change(key: str, seen: int, timeout: float) -> bool:
    """Sleep until ``key`` moved past ``seen`` or ``timeout`` passed; True if it moved. A
    bump (here, from any thread, or relayed from another process) wakes it at once."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    entry = (loop, future)
    with _lock:
        if _versions.get(key, 0) + _epoch != seen:
            return True
        _waiters.setdefault(key, set()).add(entry)
    try:
        await asyncio.wait((future,), timeout=max(0.0, timeout))
    finally:
        with _lock:
            found = _waiters.get(key)
            if found is not None:
                found.discard(entry)
                if not found:
                    del _waiters[key]
        if not future.done():
            future.cancel()
    return version(key) != seen


_logs = threading.Condition()
_log_listeners: dict[int, tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = {}
_listeners_lock = threading.Lock()
_next_listener = 0


def logs_arrived() -> None:
    """Wake every `job logs -f` follower: some attempt's server copy just grew. Threads
    waiting in ``wait_logs`` wake at once; each event loop with a listener (``on_logs``)
    gets its callback scheduled on that loop (one per loop: the followers there hang off it,
    no thread each)."""
    _logs_here()
    relay("logs")


def _logs_here() -> None:
    with _logs:
        _logs.notify_all()
    with _listeners_lock:
        listeners = list(_log_listeners.items())
    for key, (loop, callback) in listeners:
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # that loop has closed
            with _listeners_lock:
                _log_listeners.pop(key, None)


def wait_logs(timeout: float) -> None:
    with _logs:
        _logs.wait(timeout)


def on_logs(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` on ``loop`` whenever logs arrive; returns the unsubscribe."""
    global _next_listener
    with _listeners_lock:
        _next_listener += 1
        key = _next_listener
        _log_listeners[key] = (loop, callback)

    def unsubscribe() -> None:
        with _listeners_lock:
            _log_listeners.pop(key, None)

    return unsubscribe


def _auth_changed() -> None:
    from batchyard.server.security import cache

    cache.invalidate()


def deliver(message: str, kick: Callable[[], None], dirty: Callable[[int], None]) -> None:
    """Apply another server process's announcement here, without announcing it again."""
    what, _, arg = message.partition(" ")
    global _epoch
    if what == "bump" and arg == "*":  # a gap in hearing: every long poll looks again
        with _lock:
            _epoch += 1
            waiting = [entry for entries in _waiters.values() for entry in entries]
            _waiters.clear()
        _wake(waiting)
        _auth_changed()  # and what was cached of identities may be stale
    elif what == "auth":
        _auth_changed()
    elif what == "bump" and arg:
        _bump_here(arg)
    elif what == "logs":
        _logs_here()
    elif what == "kick":
        kick()
    elif what == "dirty" and arg.isdigit():
        dirty(int(arg))
    elif what == "follow" and arg:
        from batchyard.server import followups

        followups.deliver(arg)
