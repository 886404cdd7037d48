"""The node side of the node channel (standard library only: the launcher runs under
``python -S``). Everything the server learns about an attempt arrives through here: state
reports with a monotonic sequence, every log file as byte ranges keyed by offset, outputs;
and cancel/abort/finish/exec requests come back through a long poll.

Nothing is lost while the server is away: the log files on the node's disk are the spool (a
chunk is resent from the last offset the server acknowledged, and the server appends only at
exactly that offset, so resends are never duplicated), and the latest report is resent until
acknowledged.

The server may come back elsewhere: restarted on another port (its home's server.json says
where, when this node runs on its machine), or another server of the same database taking
over when the leader died. So a call that cannot reach the server tries the others it knows
(the ticket lists every server of the database, and each status reply says which are alive
now) and stays with the first that answers. Any of them takes this node's reports, chunks
and outputs exactly once: that comes from the database, not from the server process."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import ssl
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchyard.launchplan import Ticket, report_news

LOG_TICK = 0.05
REPORT_EVERY = 5.0
MAX_CHUNK = 1 << 20
MAX_BATCH = 4 << 20
MAX_NAME = 200  # the longest log file name the server takes
LONG_POLL = 20.0
ABANDON_DRAIN = 5.0  # s the last logs and report are tried once the launcher must stop


class ChannelError(Exception):
    """The server answered, and said no (4xx): retrying the same call will not help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Channel:
    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self._path = f"/api/v1/node/attempts/{ticket.attempt}/nodes/{ticket.node_rank}"
        self.server = ticket.server.rstrip("/")  # the one that answered last
        self._known = _unique([self.server, *(ticket.servers or [])])
        self._server_lock = threading.Lock()
        self._ssl = _context(ticket.server, ticket.ca_file)
        # set when the launcher was told to stop (SIGTERM) while the server may be away: the
        # retries end, and what is unsent stays in the spool on disk
        self.abandon = threading.Event()
        self._stop = threading.Event()
        self._report_lock = threading.Lock()
        self._report_wake = threading.Event()
        self._status: dict[str, Any] | None = None
        self._seq = 0
        self._acked_seq = 0
        self._acked: dict[str, int] = {}
        self._log_fd: int | None = None  # the log folder, held (a job renaming it is moot)
        self._threads: list[threading.Thread] = []
        self.on_control: Callable[[dict[str, Any]], None] = lambda _c: None
        self.control_version = -1
        self._last_sent = 0.0
        self._pending_since: float | None = None  # log bytes waiting since (log_lag)

    # --- plain calls ------------------------------------------------------------------------

    @property
    def base(self) -> str:
        return self.server + self._path

    def servers(self) -> list[str]:
        """Where to look for the server, in turn: the address in the home of a server of
        this machine (it may have come back on another port), then every one this node was
        told of."""
        home = _home_server(self.ticket.home_file)
        with self._server_lock:
            return _unique([*([home] if home else []), *self._known])

    def _failed(self, server: str) -> None:
        """``server`` did not answer: the next call goes to the next one in turn."""
        found = self.servers()
        with self._server_lock:
            if self.server != server:
                return  # another thread moved on already
            at = found.index(server) if server in found else -1
            turn = [s for s in found[at + 1:] + found[:at + 1] if s != server]
            if turn:
                self.server = turn[0]

    def learn(self, servers: Any) -> None:
        """The servers a reply says are alive now (one started since this node's ticket)."""
        if isinstance(servers, list):
            urls = [str(s).rstrip("/") for s in servers if isinstance(s, str) and s]
            with self._server_lock:
                self._known = _unique([*self._known, *urls])

    def call(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0,
             raw: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        server = self.server
        try:
            return self._call_at(server, method, path, body, timeout=timeout, raw=raw,
                                 headers=headers)
        except ChannelError:
            raise
        except OSError:
            self._failed(server)
            raise

    def _call_at(self, server: str, method: str, path: str, body: Any = None, *,
                 timeout: float = 30.0, raw: bytes | None = None,
                 headers: dict[str, str] | None = None) -> Any:
        url = path if path.startswith("http") else server + self._path + path
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                            else None)
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.ticket.token}")
        if raw is None and body is not None:
            req.add_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl) as resp:
                payload = resp.read()
                kind = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                text = json.loads(text)["error"]["message"]
            if exc.code >= 500 or exc.code == 429:
                raise OSError(f"server error {exc.code}: {text}") from None
            raise ChannelError(exc.code, str(text)) from None
        if kind.startswith("application/json"):
            return json.loads(payload or b"null")
        return payload

    def retrying(self, method: str, path: str, body: Any = None, *, deadline: float,
                 **kwargs: Any) -> Any:
        """Retry while the server is unreachable or failing (5xx), until ``deadline`` (or
        until the launcher is told to stop)."""
        delay = 0.05
        while True:
            try:
                return self.call(method, path, body, **kwargs)
            except ChannelError:
                raise
            except (OSError, ValueError):
                if time.time() + delay > deadline or self.abandon.is_set():
                    raise
                self.abandon.wait(delay)
                delay = min(delay * 1.6, 2.0)

    # --- what the node fetches --------------------------------------------------------------

    def fetch_plan(self, deadline: float) -> dict[str, Any]:
        """With the allocation this node started in, if its backend queues (Slurm): the
        first node's request is then the server's news that the gang started, and where."""
        where = self.ticket.allocation
        query = f"?{urllib.parse.urlencode(where)}" if where else ""
        data: dict[str, Any] = self.retrying("GET", f"/plan{query}", deadline=deadline)
        return data

    def fetch_code(self, sha: str, cache_dir: Path, deadline: float) -> Path:
        """Content-addressed, cached per node: a snapshot is fetched once per node."""
        target = cache_dir / f"{sha}.tar.gz"
        if target.is_file():
            return target
        cache_dir.mkdir(parents=True, exist_ok=True)
        data = self.retrying("GET", f"/snapshots/{sha}", deadline=deadline, timeout=300.0)
        if hashlib.sha256(data).hexdigest() != sha:
            raise RuntimeError(f"code snapshot {sha[:12]} arrived corrupted")
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        return target

    def rendezvous(self, ports: list[int], deadline: float) -> list[list[int]]:
        """Publish the ports this node chose and wait until every node of the gang has."""
        got = self.retrying("POST", "/rendezvous", {"ports": ports}, deadline=deadline)
        if isinstance(got, dict) and got.get("complete"):
            return [list(p) for p in got["ports"]]
        while True:
            got = self.retrying("GET", "/rendezvous", deadline=deadline,
                                timeout=LONG_POLL + 10)
            if got.get("complete"):
                return [list(p) for p in got["ports"]]
            if got.get("stop"):
                raise RuntimeError("attempt stopped before every node was ready")
            if self.abandon.is_set():
                raise RuntimeError("the launcher was told to stop before its gang was ready")
            if time.time() > deadline:
                raise RuntimeError("not every node of the gang came up in time")

    # --- reports ----------------------------------------------------------------------------

    def report(self, status: dict[str, Any]) -> None:
        """Sent at once when it says something new; a usage sample alone rides with the
        next heartbeat (REPORT_EVERY): a POST every 2 s per node was most of what a server
        with quiet jobs running spent."""
        with self._report_lock:
            self._seq += 1
            news = report_news(self._status, status)
            self._status = dict(status)
        if news:
            self._report_wake.set()

    def _send_report(self) -> bool:
        with self._report_lock:
            seq, status = self._seq, self._status
        if status is None or (seq <= self._acked_seq and not self._heartbeat_due()):
            return True
        try:
            reply = self.call("POST", "/status", {"seq": seq, "status": status}, timeout=15.0)
        except ChannelError:
            self._acked_seq = seq  # refused for good (the attempt is gone): stop resending
            return True
        except (OSError, ValueError):
            return False
        self._acked_seq = max(self._acked_seq, int(reply.get("seq", seq)))
        self._last_sent = time.time()
        self.learn(reply.get("servers"))
        control = reply.get("control")
        if isinstance(control, dict):
            self._apply_control(reply.get("version", -1), control)
        return True

    def _heartbeat_due(self) -> bool:
        return time.time() - self._last_sent > REPORT_EVERY

    def _reporter(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            self._report_wake.wait(REPORT_EVERY)
            self._report_wake.clear()
            while not self._send_report():
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, 2.0)
            delay = 0.2

    # --- control ----------------------------------------------------------------------------

    def _apply_control(self, version: int, control: dict[str, Any]) -> None:
        if version <= self.control_version:
            return
        self.control_version = version
        self.on_control(control)

    def _controller(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            try:
                reply = self.call("GET", f"/control?version={self.control_version}"
                                  f"&wait={LONG_POLL:g}", timeout=LONG_POLL + 10)
            except ChannelError:
                if self._stop.wait(2.0):
                    return
                continue
            except (OSError, ValueError):
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.2
            if isinstance(reply.get("control"), dict):
                self._apply_control(int(reply.get("version", -1)), reply["control"])

    # --- logs -------------------------------------------------------------------------------

    def ship_logs(self, log_dir: Path) -> None:
        """Ship what appears in ``log_dir``, opened now (before any job process runs): the
        files are read relative to it, never following a link, whatever a job does to the
        path meanwhile."""
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        with contextlib.suppress(OSError):
            self._log_fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

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

    def _pending_chunks(self) -> dict[str, list[Any]]:
        files: dict[str, list[Any]] = {}
        budget = MAX_BATCH
        for name, _size, offset in self._log_files():
            if budget <= 0:
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
            files[name] = [offset, base64.b64encode(data).decode()]
        return files

    def log_lag(self) -> float:
        """Seconds the oldest log bytes not yet taken by the server have waited (0: none)."""
        since = self._pending_since
        return round(time.time() - since, 2) if since is not None else 0.0

    def _ship_once(self) -> bool | None:
        """Send one batch of what is new. True: nothing is left to send; None: it went, and
        more is there already (a chatty rank, or more than a batch); False: the server could
        not take it (away or failing), so the caller backs off."""
        files = self._pending_chunks()
        if not files:
            self._pending_since = None
            return True
        if self._pending_since is None:
            self._pending_since = time.time()
        try:
            reply = self.call("POST", "/logs", {"files": files}, timeout=30.0)
        except ChannelError:
            return True
        except (OSError, ValueError):
            return False
        for name, size in (reply.get("sizes") or {}).items():
            self._acked[name] = int(size)
        if self._log_files():
            self._pending_since = time.time()  # what is left was seen by now at the latest
            return None
        self._pending_since = None
        return True

    def _shipper(self) -> None:
        delay = LOG_TICK
        while not self._stop.is_set():
            sent = self._ship_once()
            # only a failure backs off: more lines written meanwhile are no reason to wait
            delay = LOG_TICK if sent is not False else min(delay * 2, 2.0)
            self._stop.wait(delay)

    # --- outputs ----------------------------------------------------------------------------

    def upload_outputs(self, outputs: dict[str, Path], deadline: float,
                       limit: int | None = None) -> Upload:
        """Every file of the outputs that have no datastore of their own goes to the
        workspace datastore on the server; a file the server already has (same sha256) is
        skipped, so an upload resumed after a failure sends only what is missing. Links
        out of an output folder are never followed (node/outguard.py: ``skipped`` names
        them); nothing past ``limit`` bytes in all is sent (``over``)."""
        from batchyard.node.outguard import Walk

        done = Upload()
        for ident, root in outputs.items():
            walk = Walk(str(root))
            for rel, fd in walk.files():
                with os.fdopen(fd, "rb") as fh:
                    if limit is not None and done.size + os.fstat(fd).st_size > limit:
                        done.over = True
                        walk.skipped.append(f"{rel}: past limits.max_output: not uploaded")
                        continue
                    data = fh.read()
                sha = hashlib.sha256(data).hexdigest()
                quoted = urllib.parse.quote(f"{ident}/{rel}")
                self.retrying("PUT", f"/outputs/{quoted}", raw=data, deadline=deadline,
                              headers={"X-Content-Sha256": sha,
                                       "Content-Type": "application/octet-stream"},
                              timeout=300.0)
                done.count += 1
                done.size += len(data)
            done.skipped += [f"output {ident}: {line}" for line in walk.skipped]
        return done

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        for target, name in ((self._reporter, "report"), (self._shipper, "logs"),
                             (self._controller, "control")):
            thread = threading.Thread(target=target, name=f"channel-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self, deadline: float) -> bool:
        """Drain logs, then the final report (in that order: a job that looks ended has all
        its lines). Keeps retrying while the server is away, until ``deadline``, or for
        ``ABANDON_DRAIN`` seconds once the launcher was told to stop: what is left stays in
        the spool (the log files, the status file) for whoever sweeps after it."""
        self._stop.set()
        self._report_wake.set()
        for thread in self._threads:
            if thread.name != "channel-control":  # may sit in a long poll: it is a daemon
                thread.join(timeout=5)
        delay = 0.2
        while time.time() < deadline:
            if self.abandon.is_set():
                deadline = min(deadline, time.time() + ABANDON_DRAIN)
            sent = self._ship_once()
            if sent is None:
                continue  # more than one batch left: the next one at once
            if sent and self._send_final():
                return True
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        return False

    def _send_final(self) -> bool:
        with self._report_lock:
            seq = self._seq
        if seq <= self._acked_seq:
            return True
        return self._send_report() and self._acked_seq >= seq


@dataclass
class Upload:
    """What an output upload did: files and bytes sent, what it skipped and why, and
    whether it stopped at the output limit."""

    count: int = 0
    size: int = 0
    skipped: list[str] = field(default_factory=list)
    over: bool = False


def _unique(urls: list[str]) -> list[str]:
    return list(dict.fromkeys(u.rstrip("/") for u in urls if u))


def _home_server(home_file: str | None) -> str | None:
    """The address a server of this node's own machine last wrote in its home (a server
    restarted on another port), when the ticket names that file."""
    if not home_file:
        return None
    try:
        with open(home_file) as fh:
            url = json.load(fh).get("url")
    except (OSError, ValueError, AttributeError):
        return None
    return str(url).rstrip("/") if isinstance(url, str) and url else None


def _context(server: str, ca_file: str | None) -> ssl.SSLContext | None:
    if not server.startswith("https:"):
        return None
    return ssl.create_default_context(cafile=ca_file) if ca_file else \
        ssl.create_default_context()
