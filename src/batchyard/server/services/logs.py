"""`job logs [-f]` for API clients: an attempt's rank logs as the server's copy has them, read
and followed. A follower is a coroutine, not a thread: a team's followers of quiet jobs cost
the server no worker threads and no polling each.

One hub per event loop watches for all of its followers:

* a log arrival (``notify.logs_arrived``, naming its attempt, from this process or relayed
  from another) wakes the followers of that attempt at once: no follower looks at files that
  did not grow, and none waits for a sweep. A follower woken again right after a pass waits
  ``PASS_GAP`` first, so under a stream of arrivals each pass takes a batch of them;
* every ``STATE_POLL`` it reads the state and attempt number of every followed job in one
  query and wakes the followers whose job moved (started, retried, ended, deleted), and
  marks the followed attempts live (``notify.follow_logs``): their launchers then ship each
  line as it is written instead of once a second.

A woken follower reads what is new in a worker call (at most ``READ_CHUNK`` per file and
``PASS_BUDGET`` per pass; a line longer than ``MAX_LINE`` is passed on in pieces, and ``\r``
ends a line too; a file is opened as ``files.open_under`` opens it: never through a link,
regular files only), so its memory is bounded however fast a rank writes and however slowly
the client reads (the response waits for the client: Starlette's send applies
back-pressure). Worker calls of followers share a small capacity limiter of their own: a
thousand followers waking at once never take the threads API calls need. A client that
disconnects cancels its follower.

``files.follow`` is the same reading as a blocking generator (the portal's log view).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
from sqlalchemy import select

from batchyard.errors import BatchyardError, NotFound, SpecError
from batchyard.server import notify
from batchyard.server.services.files import MAX_LINE as FILES_MAX_LINE
from batchyard.server.services.files import (
    LogSource,
    _attempt,
    _fmt,
    _select,
    last_line,
    read_log,
    roots,
    split_lines,
)
from batchyard.server.services.jobs import find
from batchyard.server.services.log_frames import (
    decode_cursor,
    encode_cursor,
    end_frame,
    frame,
    source_key,
)
from batchyard.states import JOB_TERMINAL
from batchyard.store.db import Database
from batchyard.store.models import Job

READ_CHUNK = 64 * 1024  # bytes read from one file per pass
PASS_BUDGET = 256 * 1024  # bytes read for one follower per pass, all its files together
INLINE_BUDGET = 16 * 1024  # bytes a pass may read on the event loop itself
INLINE_SOURCES = 16  # files a pass may read on the event loop itself, at most
MAX_LINE = FILES_MAX_LINE  # a longer line goes out in pieces of this size
STATE_POLL = 0.25  # seconds between reads of the followed jobs' states
PASS_GAP = 0.005  # seconds between two passes of one follower, at least
SAFETY = 30.0  # a follower re-reads the database about this often, whatever happens
WORKERS = 8  # worker threads followers may use at once
TERMINAL = JOB_TERMINAL
T = TypeVar("T")
Look = tuple[int, str, int, str | None, Path | None, list[tuple[str, Path]], int | None,
             list[str]]


class Follower:
    """One client's view of one job's logs: which files, how far read, what it last knew of
    the job. Its fields change on the event loop only; worker calls return what they found."""

    def __init__(self, db: Database, workspace: str, experiment: str, name: str, *,
                 node: str | None, rank: int | None, stream: str, attempt: int | None,
                 follow: bool, prefix: bool | None,
                 resume: dict[str, int] | None = None) -> None:
        self.db = db
        self.resume = resume or {}  # offsets a reconnecting follower had got (log_frames)
        self.where = (workspace, experiment, name)
        self.node, self.rank, self.stream, self.attempt = node, rank, stream, attempt
        self.follow, self.prefix = follow, prefix
        self.sources: dict[Path, LogSource] = {}
        self.job_id: int | None = None
        self.uuid: str | None = None  # the attempt followed, once it has one
        self.known: tuple[str, int] | None = None  # (job state, attempt number) last seen
        self.state = ""
        self.root: Path | None = None
        self.root_mtime: int | None = None
        self.node_names: list[str] = []
        self.stale = True  # the database must be read again before the next pass
        self.more = False  # the last pass left bytes unread (budgets)
        self.wake = asyncio.Event()
        self.passed_at = 0.0  # (monotonic) when the last pass ended

    # --- worker calls (no shared state is changed in them) --------------------------------

    def look(self) -> Look:
        """Job id, state, attempt number, the attempt's uuid, log directory, its log files,
        its mtime and the attempt's node names."""
        with self.db.session() as session:
            job = find(session, *self.where)
            if self.stream not in ("stdout", "stderr", "all"):
                raise SpecError("stream: use stdout, stderr or all")
            found = (job.id, job.state, job.attempt)
            try:
                att = _attempt(session, job, self.attempt)
                att_dir: str | None = att.directory
                uuid: str | None = att.uuid
                node_names = list((att.handle or {}).get("node_names") or [])
            except NotFound:  # following a job that has not started (or its next attempt)
                if not self.follow or job.state in TERMINAL or (
                        self.attempt is not None and self.attempt > job.attempt + 1):
                    raise
                att_dir, uuid, node_names = None, None, []
        if att_dir is None:
            return (*found, None, None, [], None, [])
        root = roots(att_dir)["stdouterr"]
        mtime = _mtime(root)
        return (*found, uuid, root, _select(root, self.node, self.rank, self.stream,
                                            node_names), mtime, node_names)

    def relist(self, root: Path, node_names: list[str]) -> tuple[list[tuple[str, Path]],
                                                                  int | None]:
        mtime = _mtime(root)
        return _select(root, self.node, self.rank, self.stream, node_names), mtime

    @staticmethod
    def read(sources: list[LogSource], budget: int = PASS_BUDGET) -> tuple[
            list[tuple[LogSource, bytes]], bool]:
        """New bytes of each file, within the budgets; True if some were left for the next
        pass."""
        out: list[tuple[LogSource, bytes]] = []
        more = False
        for src in sources:
            if budget <= 0:
                more = True
                break
            want = min(READ_CHUNK, budget)
            data = read_log(src.path, src.offset, want)  # never through a link
            if data:
                out.append((src, data))
                budget -= len(data)
                if len(data) == want:
                    more = True
        return out, more

    # --- on the loop ------------------------------------------------------------------------

    def apply_look(self, found: Look) -> None:
        job_id, state, attempt, uuid, root, files, mtime, node_names = found
        self.job_id, self.state, self.known = job_id, state, (state, attempt)
        if root is not None:
            self.root, self.root_mtime, self.node_names = root, mtime, node_names
            self.uuid = uuid
            if self.follow and uuid is not None and state not in TERMINAL:
                notify.follow_logs(uuid)
        self.add_sources(files)
        self.stale = False

    def add_sources(self, files: list[tuple[str, Path]]) -> None:
        for label, path in files:
            if path not in self.sources:
                self.sources[path] = LogSource(label, path,
                                               self.resume.get(source_key(path), 0))

    def cursor(self) -> str:
        """Where the lines sent so far end, file by file (a partial line is not sent)."""
        return encode_cursor({**self.resume, **{
            source_key(s.path): s.offset - len(s.partial) for s in self.sources.values()}})

    def lines(self, got: list[tuple[LogSource, bytes]]) -> list[bytes]:
        """Complete lines of what was read, formatted; partial lines are kept (bounded)."""
        show = self._show_prefix()
        out = []
        for src, chunk in got:
            src.offset += len(chunk)
            parts, src.partial = split_lines(src.partial, chunk)  # bounded, \r ends lines
            if parts:
                out.append(b"".join(_fmt(src.label, ln, show) for ln in parts))
        return out

    def rest(self) -> bytes:
        show = self._show_prefix()
        out = b"".join(_fmt(s.label, line, show) for s in self.sources.values()
                       if (line := last_line(s.partial)) is not None)
        for s in self.sources.values():
            s.partial = b""
        return out

    def _show_prefix(self) -> bool:
        if self.prefix is not None:
            return self.prefix
        return len(self.sources) > 1 or self.rank is None


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


# --- the hub ------------------------------------------------------------------------------


class _Hub:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # weak: a follower whose response was dropped before its body started goes with it
        self.followers: weakref.WeakSet[Follower] = weakref.WeakSet()
        self.limiter = anyio.CapacityLimiter(WORKERS)
        self.task: asyncio.Task[None] | None = None
        self.unsubscribe: Callable[[], None] | None = None

    def add(self, f: Follower) -> None:
        self.followers.add(f)
        if self.unsubscribe is None:
            self.unsubscribe = notify.on_logs(self.loop, self.arrived)
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run(), name="log-follow-hub")

    def remove(self, f: Follower) -> None:
        self.followers.discard(f)

    def arrived(self, attempt: str | None) -> None:
        """Logs of ``attempt`` (None: of any) landed: wake its followers."""
        for f in list(self.followers):
            if attempt is None or f.uuid == attempt:
                f.wake.set()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def _run(self) -> None:
        try:
            while self.followers:
                await asyncio.sleep(STATE_POLL)
                for uuid in {f.uuid for f in self.followers if f.follow and f.uuid}:
                    notify.follow_logs(uuid)  # (marks again only every LIVE_REFRESH)
                await self._poll_states()
        finally:
            if self.unsubscribe is not None:
                self.unsubscribe()
                self.unsubscribe = None

    async def _poll_states(self) -> None:
        """One query for every followed job: wake those whose state or attempt moved."""
        ids = sorted({f.job_id for f in self.followers if f.job_id is not None})
        if not ids:
            return
        db = next(iter(self.followers)).db

        def states() -> dict[int, tuple[str, int]]:
            found: dict[int, tuple[str, int]] = {}
            with db.session() as session:
                for start in range(0, len(ids), 500):
                    rows = session.execute(select(Job.id, Job.state, Job.attempt)
                                           .where(Job.id.in_(ids[start:start + 500])))
                    found.update({r[0]: (r[1], r[2]) for r in rows})
            return found

        try:
            now = await self.run(states)
        except Exception:  # the database is away for a moment: followers wait, as before
            return
        for f in list(self.followers):
            if f.job_id is not None and now.get(f.job_id) != f.known:
                f.stale = True
                f.wake.set()


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Hub] = \
    weakref.WeakKeyDictionary()


def _hub() -> _Hub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = _Hub(loop)
    return hub


# --- the API ------------------------------------------------------------------------------


async def open_follow(db: Database, workspace: str, experiment: str, name: str, *,
                      node: str | None = None, rank: int | None = None, stream: str = "all",
                      attempt: int | None = None, follow: bool = False,
                      prefix: bool | None = None, cursor: str | None = None,
                      framed: bool = False) -> tuple[bytes, AsyncIterator[bytes]]:
    """What is there now and the stream of the rest. Errors (no such job, no attempt yet
    without follow, a bad argument, a bad cursor) are raised here, before any byte is sent,
    so they become a 4xx answer rather than a broken stream. ``cursor``: go on after what a
    previous stream sent up to there; ``framed``: JSON lines with cursors (log_frames)."""
    resume = decode_cursor(cursor or "")
    hub = _hub()
    f = Follower(db, workspace, experiment, name, node=node, rank=rank, stream=stream,
                 attempt=attempt, follow=follow, prefix=prefix, resume=resume)
    if follow:
        hub.add(f)  # before the first pass: nothing that lands from here on goes unseen
    try:
        first = await _pass(hub, f)
    except BaseException:
        hub.remove(f)
        raise
    if framed:
        return (frame(first, f.cursor()) if first else b""), _framed(f, _stream(hub, f))
    return first, _stream(hub, f)


async def _framed(f: Follower, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for data in rest:
        yield frame(data, f.cursor())
    yield end_frame(f.state, f.cursor())  # (a cut stream has no end line: reconnect)


async def _pass(hub: _Hub, f: Follower) -> bytes:
    """Re-read the job if due, then what is new in its files: the formatted lines."""
    f.wake.clear()  # a wake from here on means "look again"
    if f.stale:
        f.apply_look(await hub.run(f.look))
    elif f.root is not None and _mtime(f.root) != f.root_mtime:  # a new log file
        files, f.root_mtime = await hub.run(f.relist, f.root, f.node_names)
        f.add_sources(files)
    sources = list(f.sources.values())
    if not f.more and len(sources) <= INLINE_SOURCES:
        # what a launcher just sent is in the page cache: a few small reads on the loop
        # cost less than a worker thread's round trip (the rest, if any, goes there)
        got, f.more = f.read(sources, INLINE_BUDGET)
    else:
        got, f.more = await hub.run(f.read, sources)
    return b"".join(f.lines(got))


async def _stream(hub: _Hub, f: Follower) -> AsyncIterator[bytes]:
    try:
        drained = False
        while True:
            done = f.state in TERMINAL
            if f.more:
                pass  # the budgets left bytes unread: read on at once
            elif not f.follow or (done and drained):
                rest = f.rest()
                if rest:
                    yield rest
                return
            elif done:  # one more pass to drain what was written at the end
                drained = True
                f.stale = True
            else:
                try:  # jittered: followers that came together do not all re-read together
                    await asyncio.wait_for(f.wake.wait(), SAFETY * random.uniform(0.5, 1.5))
                except TimeoutError:
                    f.stale = True
            gap = PASS_GAP - (time.monotonic() - f.passed_at)
            if gap > 0:  # woken again at once: let a few more arrivals join this pass
                await asyncio.sleep(gap)
            try:
                data = await _pass(hub, f)
            except BatchyardError:  # the job was deleted meanwhile: the stream just ends
                return
            f.passed_at = time.monotonic()
            if data:
                yield data
    finally:
        hub.remove(f)
