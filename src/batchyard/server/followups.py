"""Which active attempts the reconciler must look at now: the events that change one.

The reconciler followed every active attempt four times a second (a transaction each):
with ten jobs running that was 12 % of a core for a server with nothing to decide. It now
looks at an attempt when something changed it (here), when a timer of its own is due, or
when its backend says a launcher died (``server/agenda.py``). What changes an attempt:

* a launcher's report that says something new (a state, its ranks, a verdict; not a usage
  sample), or a node report marked lost by anyone (``NodeReport.state`` set);
* a change of its control (``channel.set_control``: a cancel, an abort, a hang);
* a terminate of its job (``Job.cancel_requested`` set);
* a stack dump arriving (the hang watchdog waits for them).

A mark takes effect once the transaction that made the change commits (a look before it
would see the old rows and not look again); another server process on the same PostgreSQL
database, the one that reconciles, hears it through ``notify.relay`` (``follow ...``). A
gap in hearing (``follow *``) makes the reconciler look at everything, and so does a
periodic sweep, in case some change came by a path nobody marked."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, object_session

from batchyard.launchplan import report_news
from batchyard.server import notify
from batchyard.store.models import Attempt, Job, NodeReport

_lock = threading.Lock()
_attempts: set[int] = set()
_jobs: set[int] = set()
_everything = False
_wake: Callable[[], None] | None = None
_leads_here: Callable[[], bool] = lambda: True  # noqa: E731
_PENDING = "followups"  # session.info: (attempt ids, job ids) marked in its transaction


def configure(wake: Callable[[], None] | None,
              leads_here: Callable[[], bool] | None = None) -> None:
    """``wake``: wakes this process's reconciler; ``leads_here``: whether it is the one that
    reconciles (if not, marks go to the other processes too)."""
    global _wake, _leads_here
    _wake = wake
    _leads_here = leads_here or (lambda: True)


def attempt(session: Session | None, attempt_id: int | None) -> None:
    """Look at this attempt once ``session`` commits (at once without a session)."""
    if attempt_id is None:
        return
    if session is None:
        _mark({attempt_id}, set())
        return
    session.info.setdefault(_PENDING, (set(), set()))[0].add(attempt_id)


def job(session: Session | None, job_id: int | None) -> None:
    """Look at this job's active attempt once ``session`` commits."""
    if job_id is None:
        return
    if session is None:
        _mark(set(), {job_id})
        return
    session.info.setdefault(_PENDING, (set(), set()))[1].add(job_id)


def everything() -> None:
    """Look at every active attempt (taking the lease over, a gap in hearing the others)."""
    global _everything
    with _lock:
        _everything = True
    if _wake is not None:
        _wake()


def take() -> tuple[set[int], set[int], bool]:
    """(attempt ids, job ids, everything) marked since the last take."""
    global _attempts, _jobs, _everything
    with _lock:
        taken = (_attempts, _jobs, _everything)
        _attempts, _jobs, _everything = set(), set(), False
    return taken


def deliver(arg: str) -> None:
    """Another server process's ``follow`` message: ``a<id>``, ``j<id>`` or ``*``."""
    if arg == "*":
        everything()
    elif arg[:1] == "a" and arg[1:].isdigit():
        _mark({int(arg[1:])}, set(), relay=False)
    elif arg[:1] == "j" and arg[1:].isdigit():
        _mark(set(), {int(arg[1:])}, relay=False)


def _mark(attempts: set[int], jobs: set[int], relay: bool = True) -> None:
    with _lock:
        _attempts.update(attempts)
        _jobs.update(jobs)
    if _wake is not None:
        _wake()
    if relay and not _leads_here():
        for ident in attempts:
            notify.relay(f"follow a{ident}")
        for ident in jobs:
            notify.relay(f"follow j{ident}")


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    pending = session.info.pop(_PENDING, None)
    if pending is not None:
        _mark(*pending)


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_PENDING, None)


@event.listens_for(Attempt.control, "set")  # a cancel, an abort, a hang (channel.set_control)
@event.listens_for(Attempt.node_ids, "set")  # bound to its nodes (a queue's start callback)
def _attempt_changed(target: Attempt, value: Any, old: Any, _initiator: Any) -> None:
    session = object_session(target)  # None: an attempt being made
    if session is not None and target.id is not None:
        attempt(session, target.id)


@event.listens_for(NodeReport.data, "set")
def _report_data(target: NodeReport, value: Any, old: Any, _initiator: Any) -> None:
    """A report that says something besides a new usage sample."""
    session = object_session(target)
    if session is not None and isinstance(value, dict) and report_news(
            old if isinstance(old, dict) else None, value):
        attempt(session, target.attempt_id)


@event.listens_for(NodeReport.state, "set")
def _report_state(target: NodeReport, value: Any, old: Any, _initiator: Any) -> None:
    session = object_session(target)  # None: a row being made (its attempt is launching)
    if session is not None and value != old:
        attempt(session, target.attempt_id)


@event.listens_for(Job.cancel_requested, "set")
def _job_canceled(target: Job, value: Any, old: Any, _initiator: Any) -> None:
    session = object_session(target)
    if session is not None and value and value != old:
        job(session, target.id)
