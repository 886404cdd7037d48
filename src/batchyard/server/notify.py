"""Wake-ups for the node channel's long polls. Every change a launcher must hear of (cancel,
abort, finish, a relay exec, a rendezvous, an exec's exit) bumps a counter per attempt; a long
poll sleeps until its attempt's counter moves, then re-reads the database. The counters are
only a hint (a restarted server starts at zero): the database is the truth.

Log arrivals name their attempt (``logs_arrived``): threads wait on a condition, event loops
subscribe a callback (``on_logs``; services.logs wakes the followers of that attempt off it).
Followers mark their attempt live (``follow_logs``), which its launchers hear in their replies
(``logs_live``): they ship each line at once then, and batch it for a second otherwise.

Several server processes on one PostgreSQL database (``--workers``, or a standby) hear each
other's wake-ups through ``server.bus``: it installs itself as the ``relay`` here, and hands
what other processes announce to ``deliver``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
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
    """Tell the other server processes (if any): ``kick``, ``bump KEY``, ``logs [ATTEMPT]``,
    ``live ATTEMPT`` (its logs are followed), ``dirty JOB_ID``, ``follow a<ATTEMPT_ID>|j<JOB_ID>|*``
    (server/followups.py), ``auth`` (identities or roles changed: forget what was cached)."""
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
_log_listeners: dict[int, tuple[asyncio.AbstractEventLoop, Callable[[str | None], None]]] = {}
_listeners_lock = threading.Lock()
_next_listener = 0


def logs_arrived(attempt: str | None = None) -> None:
    """Some attempt's server copy just grew (``attempt``: its uuid; None: any may have).
    Threads waiting in ``wait_logs`` wake at once; each event loop with a listener
    (``on_logs``) gets its callback scheduled on that loop with the uuid, so it wakes the
    followers of that attempt only, and at once; the other server processes hear it too."""
    _logs_here(attempt)
    relay(f"logs {attempt}" if attempt else "logs")


def _logs_here(attempt: str | None) -> None:
    with _logs:
        _logs.notify_all()
    with _listeners_lock:
        listeners = list(_log_listeners.items())
    for key, (loop, callback) in listeners:
        try:
            loop.call_soon_threadsafe(callback, attempt)
        except RuntimeError:  # that loop has closed
            with _listeners_lock:
                _log_listeners.pop(key, None)


def wait_logs(timeout: float) -> None:
    with _logs:
        _logs.wait(timeout)


def on_logs(loop: asyncio.AbstractEventLoop,
            callback: Callable[[str | None], None]) -> Callable[[], None]:
    """Call ``callback(attempt uuid or None)`` on ``loop`` whenever logs arrive; returns the
    unsubscribe."""
    global _next_listener
    with _listeners_lock:
        _next_listener += 1
        key = _next_listener
        _log_listeners[key] = (loop, callback)

    def unsubscribe() -> None:
        with _listeners_lock:
            _log_listeners.pop(key, None)

    return unsubscribe


# Attempts whose logs someone follows (`job logs -f`, the portal), until when (monotonic):
# their launchers ship each line at once; the others' wait up to a second, batched
# (node/logship.py). A follower marks its attempt again every LIVE_REFRESH seconds, in every
# server process (relayed), so a mark outlives the follower by LIVE_TTL at most.
LIVE_TTL = 30.0
LIVE_REFRESH = 10.0
_live: dict[str, float] = {}
_marked: dict[str, float] = {}  # when this process last marked (and relayed) an attempt


def follow_logs(attempt: str) -> None:
    """A follower of ``attempt``'s logs is here: mark it live (cheap to call often: it
    marks and tells the other processes at most every ``LIVE_REFRESH`` seconds)."""
    now = time.monotonic()
    with _lock:
        if now - _marked.get(attempt, -LIVE_TTL) < LIVE_REFRESH:
            return
        _marked[attempt] = now
        if len(_marked) > 4096:  # forget what no follower refreshed for long
            for key in [k for k, t in _marked.items() if now - t > LIVE_TTL]:
                del _marked[key]
    _mark_live(attempt)
    relay(f"live {attempt}")


def _mark_live(attempt: str) -> None:
    """Mark here; an attempt that was not live before gets its long polls woken, so its
    launchers hear it at once (the control poll answers when ``live`` changed)."""
    now = time.monotonic()
    with _lock:
        fresh = _live.get(attempt, 0.0) <= now
        _live[attempt] = now + LIVE_TTL
        if len(_live) > 4096:
            for key in [k for k, until in _live.items() if until <= now]:
                del _live[key]
    if fresh:
        _bump_here(attempt)


def logs_live(attempt: str) -> bool:
    """Whether someone follows ``attempt``'s logs now (as far as this process heard)."""
    with _lock:
        return _live.get(attempt, 0.0) > time.monotonic()


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
        _logs_here(arg or None)
    elif what == "live" and arg:
        _mark_live(arg)
    elif what == "kick":
        kick()
    elif what == "dirty" and arg.isdigit():
        dirty(int(arg))
    elif what == "follow" and arg:
        from batchyard.server import followups

        followups.deliver(arg)
