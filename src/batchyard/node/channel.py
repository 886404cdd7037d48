"""The node side of the node channel (standard library only: the launcher runs under
``python -S``). Everything the server learns about an attempt arrives through here: state
reports with a monotonic sequence, every log file as byte ranges keyed by offset, outputs;
and cancel/abort/finish/exec requests come back through a long poll.

Nothing is lost while the server is away: the log files on the node's disk are the spool (a
chunk is resent from the last offset the server acknowledged, and the server appends only at
exactly that offset, so resends are never duplicated; node/logship.py), and the latest report
is resent until acknowledged. The final report (the node ended) goes only once the server's
copy has every log byte: the job must not look ended, and its followers stop, before its last
lines are there. A report that only brings a usage sample is not worth a call of
its own: it waits a little for a log batch to carry it.

The server may come back elsewhere: restarted on another port (its home's server.json says
where, when this node runs on its machine), or another server of the same database taking
over when the leader died. So a call that cannot reach the server tries the others it knows
(the ticket lists every server of the database, and each status reply says which are alive
now) and stays with the first that answers. Any of them takes this node's reports, chunks
and outputs exactly once: that comes from the database, not from the server process."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchyard.launchplan import Ticket
from batchyard.node.httpconn import Connections, HttpStatusError
from batchyard.node.logship import LogShipping
from batchyard.node.logwatch import DirWatch

REPORT_EVERY = 5.0
# s a report that only brings a usage sample may wait for a log batch to ride with
SAMPLE_HOLD = 3.0
SAMPLE_KEYS = frozenset({"util", "scrape", "gpu", "updated_at"})
LONG_POLL = 20.0
ABANDON_DRAIN = 5.0  # s the last logs and report are tried once the launcher must stop


class ChannelError(Exception):
    """The server answered, and said no (4xx): retrying the same call will not help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Channel(LogShipping):
    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self._path = f"/api/v1/node/attempts/{ticket.attempt}/nodes/{ticket.node_rank}"
        self.server = ticket.server.rstrip("/")  # the one that answered last
        self._known = _unique([self.server, *(ticket.servers or [])])
        self._server_lock = threading.Lock()
        self._http = Connections(_context(ticket.server, ticket.ca_file))
        # set when the launcher was told to stop (SIGTERM) while the server may be away: the
        # retries end, and what is unsent stays in the spool on disk
        self.abandon = threading.Event()
        self._stop = threading.Event()
        self._report_lock = threading.Lock()
        self._report_wake = threading.Event()
        self._status: dict[str, Any] | None = None
        self._seq = 0
        self._acked_seq = 0
        self._due: float | None = None  # (monotonic) when the unacknowledged report must go
        self._threads: list[threading.Thread] = []
        self.on_control: Callable[[dict[str, Any]], None] = lambda _c: None
        self.control_version = -1
        self._last_sent = 0.0
        self._init_logs()

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
        sent = {"Authorization": f"Bearer {self.ticket.token}"}
        if raw is None and body is not None:
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        try:
            kind, payload = self._http.request(method, url, data, sent, timeout)
        except HttpStatusError as exc:
            text: Any = exc.body.decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                text = json.loads(text)["error"]["message"]
            if exc.status >= 500 or exc.status == 429:
                raise OSError(f"server error {exc.status}: {text}") from None
            raise ChannelError(exc.status, str(text)) from None
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
        """Sent at once, unless all it brings is a new usage sample: that waits up to
        ``SAMPLE_HOLD`` for a log batch to ride with (logship.py), or the next heartbeat."""
        with self._report_lock:
            before = self._status
            sample = before is not None and all(
                status.get(k) == before.get(k) for k in status.keys() | before.keys()
                if k not in SAMPLE_KEYS)
            self._seq += 1
            self._status = dict(status)
            due = time.monotonic() + (SAMPLE_HOLD if sample else 0.0)
            self._due = due if self._due is None else min(self._due, due)
        self._report_wake.set()
        if _final(status):
            self._wake_shipper()  # what is left goes now, even if nobody follows

    def report_to_ride(self) -> tuple[int, dict[str, Any]] | None:
        """The report not yet acknowledged, for a log batch to carry (never the final one:
        that goes alone, once the logs are drained)."""
        with self._report_lock:
            if self._status is None or self._seq <= self._acked_seq or _final(self._status):
                return None
            return self._seq, self._status

    def final_pending(self) -> bool:
        """The node's final report is not acknowledged yet (the shipper hurries then)."""
        with self._report_lock:
            return self._status is not None and self._seq > self._acked_seq \
                and _final(self._status)

    def _holds_final(self) -> bool:
        """The node's final report waits while the server's copy lacks log bytes: the job
        must not end (and its followers stop) before its last lines are there."""
        return self.final_pending() and self.logs_pending()

    def logs_drained(self) -> None:
        """The shipper found nothing left to send: a final report held back may go."""
        self._report_wake.set()

    def took_report(self, reply: dict[str, Any], seq: int) -> None:
        """The server's answer to report ``seq`` (alone or with a log batch)."""
        with self._report_lock:
            self._acked_seq = max(self._acked_seq, int(reply.get("seq", seq)))
            if self._acked_seq >= self._seq:
                self._due = None
        self._last_sent = time.time()
        self.learn(reply.get("servers"))
        self.note_live(reply)
        control = reply.get("control")
        if isinstance(control, dict):
            self._apply_control(reply.get("version", -1), control)

    def _send_report(self, *, hold_final: bool = True) -> bool:
        held = hold_final and self._holds_final()
        with self._report_lock:
            seq, status = self._seq, self._status
            if held:  # only a heartbeat, with what the server has already
                seq, status = self._acked_seq, {}
        if status is None or seq < 1 or (seq <= self._acked_seq and not self._heartbeat_due()):
            return True
        try:
            reply = self.call("POST", "/status", {"seq": seq, "status": status}, timeout=15.0)
        except ChannelError:
            with self._report_lock:  # refused for good (the attempt is gone): stop resending
                self._acked_seq, self._due = max(self._acked_seq, seq), None
            self._last_sent = time.time()
            return True
        except (OSError, ValueError):
            return False
        self.took_report(reply, seq)
        return True

    def _heartbeat_due(self) -> bool:
        return time.time() - self._last_sent > REPORT_EVERY

    def _report_in(self) -> float:
        """Seconds until the reporter must send: the pending report's time, or the
        heartbeat's."""
        beat = self._last_sent + REPORT_EVERY - time.time()
        with self._report_lock:
            if self._status is None:
                return REPORT_EVERY
            due = self._due if self._seq > self._acked_seq else None
        if due is not None and self._holds_final():
            due = None  # until the shipper has drained the logs (``logs_drained``)
        return beat if due is None else min(beat, due - time.monotonic())

    def _reporter(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            wait = self._report_in()
            if wait > 0:
                self._report_wake.wait(wait)
                self._report_wake.clear()
                continue
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
        """The long poll for what the server asks of this node. It says whether this node
        takes the job's logs to be followed (``live``), so a follower that comes (or the last
        one that goes) ends it at once."""
        delay = 0.2
        while not self._stop.is_set():
            try:
                reply = self.call("GET", f"/control?version={self.control_version}"
                                  f"&wait={LONG_POLL:g}&live={int(self.live is not False)}",
                                  timeout=LONG_POLL + 10)
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
            self.note_live(reply)
            if isinstance(reply.get("control"), dict):
                self._apply_control(int(reply.get("version", -1)), reply["control"])

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
        self._watch = DirWatch()
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
        self._wake_shipper()
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
        return self._send_report(hold_final=False) and self._acked_seq >= seq


def _final(status: dict[str, Any]) -> bool:
    return "ended_at" in status


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
