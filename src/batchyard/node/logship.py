"""The log half of the node channel (standard library only, like the launcher).

The node's log files are the spool: a file is sent as byte ranges from the offset the server
acknowledged, and the server appends only at exactly that offset, so a resend (after a crash,
a partition, another server taking over) is never duplicated.

When to send. The shipper sleeps until a rank writes (inotify: node/logwatch.py), then sends
what is new at once if someone follows the job's logs (`job logs -f`, the portal: the server
says so in its replies, ``live``), else at most once every ``LAZY`` seconds, so a chatty job
nobody watches costs the server one call a second rather than twenty. Either way only one
batch is in flight at a time: lines written meanwhile go in the next, which leaves as soon as
the reply came (``LIVE_GAP`` apart at least). A usage sample waiting to be reported rides with
a batch that holds every pending byte (channel.py), instead of a call of its own."""

from __future__ import annotations

import base64
import contextlib
import os
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchyard.node.logwatch import DirWatch

LOG_TICK = 0.05  # s between looks where inotify is not available
LIVE_GAP = 0.005  # s between the starts of two batches while the logs are followed
# s a batch that ends mid-line waits for the rest (Python's print writes a line, then its
# newline: without this the newline went 10 ms later in a batch of its own)
LINE_SETTLE = 0.002
LAZY = 1.0  # s between two batches while nobody follows them
RESCAN = 2.0  # s between looks that inotify did not ask for (a writer it cannot see)
MAX_CHUNK = 1 << 20
MAX_BATCH = 4 << 20
MAX_NAME = 200  # the longest log file name the server takes
# s a server may refuse batches (4xx) before the node stops counting on it to take them
REFUSED_GIVE_UP = 60.0


class LogShipping:
    """Mixed into ``Channel``: the log files of one directory, shipped as they grow."""

    _stop: threading.Event

    if TYPE_CHECKING:  # what the channel provides
        def call(self, method: str, path: str, body: Any = None, *,
                 timeout: float = 30.0) -> Any: ...

        def report_to_ride(self) -> tuple[int, dict[str, Any]] | None: ...

        def took_report(self, reply: dict[str, Any], seq: int) -> None: ...

        def logs_drained(self) -> None: ...

        def final_pending(self) -> bool: ...

    def _init_logs(self) -> None:
        self._log_fd: int | None = None  # the log folder, held (a job renaming it is moot)
        self._log_gen = 0  # how many times ship_logs was called (the watch follows)
        self._acked: dict[str, int] = {}
        self._pending_since: float | None = None  # log bytes waiting since (log_lag)
        self._posted_at = -1e9  # (monotonic) when the last batch the server took was sent
        self._watch: DirWatch | None = None
        # None until the server said: treated as followed (a server of before `live` never
        # says, and shipping at once is what it was used to)
        self.live: bool | None = None
        self._ride = True  # usage reports go with the logs (False: this server refused one)
        self._refused_since: float | None = None  # (monotonic) batches refused (4xx) since
        self._given_up = False  # refused for good: what is left stays in the spool

    def ship_logs(self, log_dir: Path) -> None:
        """Ship what appears in ``log_dir``, opened now (before any job process runs): the
        files are read relative to it, never following a link, whatever a job does to the
        path meanwhile."""
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        with contextlib.suppress(OSError):
            self._log_fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._log_gen += 1
        self._wake_shipper()

    def _wake_shipper(self) -> None:
        if self._watch is not None:
            self._watch.wake()

    def note_live(self, reply: Any) -> None:
        """A reply said whether the job's logs are followed now; from not to followed, what
        waits is sent at once."""
        live = reply.get("live") if isinstance(reply, dict) else None
        if isinstance(live, bool) and live != self.live:
            self.live = live
            if live:
                self._wake_shipper()

    # --- what there is to send --------------------------------------------------------------

    def _log_files(self) -> list[tuple[str, int, int]]:
        """(name, size, acknowledged offset) of every log file with something to send."""
        out: list[tuple[str, int, int]] = []
        if self._log_fd is None:
            return out
        try:
            names = sorted(os.listdir(self._log_fd))
        except OSError:
            return out
        for name in names:
            if name.startswith(".") or len(name) > MAX_NAME:
                continue  # (a name the server refuses would hold up the whole batch)
            try:  # a link a rank planted (to a secret, /dev/zero) is not a log
                st = os.stat(name, dir_fd=self._log_fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                continue
            size = st.st_size
            offset = self._acked.get(name, 0)
            if size < offset or (size == offset and name in self._acked):
                continue  # (an empty file is sent once, so the server's copy has it too)
            out.append((name, size, offset))
        return out

    def _pending_chunks(self) -> tuple[dict[str, list[Any]], bool]:
        """The next batch, and whether it holds every pending byte (a report may ride with
        it only then: a job that looks ended on the server has all its lines)."""
        files: dict[str, list[Any]] = {}
        budget = MAX_BATCH
        whole = True
        for name, size, offset in self._log_files():
            if budget <= 0:
                whole = False
                break
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=self._log_fd)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                fh.seek(offset)
                data = fh.read(min(MAX_CHUNK, budget))
            budget -= len(data)
            whole = whole and offset + len(data) >= size
            files[name] = [offset, base64.b64encode(data).decode()]
        return files, whole

    def logs_pending(self) -> bool:
        """Whether some log bytes are not in the server's copy yet (and it still takes them)."""
        return not self._given_up and bool(self._log_files())

    def log_lag(self) -> float:
        """Seconds the oldest log bytes not yet taken by the server have waited (0: none)."""
        since = self._pending_since
        return round(time.time() - since, 2) if since is not None else 0.0

    # --- sending ----------------------------------------------------------------------------

    def _ship_once(self, settle: float = 0.0) -> bool | None:
        """Send one batch of what is new. True: nothing is left to send; None: it went, and
        more is there already (a chatty rank, or more than a batch); False: the server could
        not take it (away or failing), so the caller backs off. ``settle``: how long a batch
        that ends mid-line may wait for the rest of the line."""
        from batchyard.node.channel import ChannelError

        files, whole = self._pending_chunks()
        if settle > 0 and self._watch is not None and _mid_line(files):
            self._watch.wait(settle)
            files, whole = self._pending_chunks()
        if not files:
            self._pending_since = None
            return True
        if self._pending_since is None:
            self._pending_since = time.time()
        body: dict[str, Any] = {"files": files}
        riding = self.report_to_ride() if whole and self._ride else None
        if riding is not None:
            body["report"] = {"seq": riding[0], "status": riding[1]}
        started = time.monotonic()
        try:
            reply = self.call("POST", "/logs", body, timeout=30.0)
        except ChannelError as exc:
            if riding is not None and exc.status == 422:
                self._ride = False  # a server of before reports rode with logs
                return None
            return self._refused(exc.status)
        except (OSError, ValueError):
            return False
        self._posted_at = started
        self._refused_since, self._given_up = None, False
        for name, size in (reply.get("sizes") or {}).items():
            self._acked[name] = int(size)
        if riding is not None and "seq" in reply:
            self.took_report(reply, riding[0])
        self.note_live(reply)
        if self._log_files():
            self._pending_since = time.time()  # what is left was seen by now at the latest
            return None
        self._pending_since = None
        return True

    def _refused(self, status: int) -> bool:
        """A batch refused (4xx) is not sent: it is tried again (a server on its way up, a
        credential it checks against the database) until the attempt is gone (404) or it was
        refused for ``REFUSED_GIVE_UP`` seconds. True: given up; the bytes stay on disk."""
        now = time.monotonic()
        if self._refused_since is None:
            self._refused_since = now
        if status == 404 or now - self._refused_since >= REFUSED_GIVE_UP:
            self._given_up = True
            return True
        return False

    def _shipper(self) -> None:
        watch = self._watch
        assert watch is not None
        dirty = True
        backoff = LOG_TICK
        gen = -1
        rescan_at = 0.0
        try:
            while not self._stop.is_set():
                if self._log_fd is None:
                    watch.wait(RESCAN, changes=False)  # until ship_logs wakes it
                    continue
                if (not watch.watching or gen != self._log_gen) and \
                        watch.watch_fd(self._log_fd):
                    dirty = True  # what was written before the watch began
                gen = self._log_gen
                if not dirty:
                    now = time.monotonic()
                    if watch.watching:
                        watch.wait(max(0.0, rescan_at - now))
                        dirty = watch.changed() or time.monotonic() >= rescan_at
                    else:
                        watch.wait(LOG_TICK)
                        dirty = True
                    continue
                hurry = self.live is not False or self.final_pending()
                gap = (LIVE_GAP if hurry else LAZY) - (time.monotonic() - self._posted_at)
                if gap > 0:
                    watch.wait(gap, changes=False)  # cut short when the logs get followed
                    continue
                watch.changed()  # taken now: what they announce is in the batch below
                rescan_at = time.monotonic() + RESCAN
                sent = self._ship_once(LINE_SETTLE)
                if sent is False:  # only a failure backs off
                    watch.wait(backoff, changes=False)
                    backoff = min(backoff * 2, 2.0)
                    continue
                backoff = LOG_TICK
                dirty = sent is None
                if sent:
                    self.logs_drained()
        finally:
            self._watch = None
            watch.close()


def _mid_line(files: dict[str, list[Any]]) -> bool:
    """Whether some chunk ends inside a line (its base64 does not end with a newline's)."""
    for _offset, data in files.values():
        if data and not base64.b64decode(data[-4:]).endswith(b"\n"):
            return True
    return False
