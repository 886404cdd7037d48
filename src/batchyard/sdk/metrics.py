"""Metrics from inside a job: ``batchyard.log_metric(name, value, step)`` (and ``run.log`` of
the azureml compat layer) never block training.

A call only converts the value and appends it to an in-memory queue. A background thread
posts the queue in batches to ``$BATCHYARD_API`` with the job-scoped ``$BATCHYARD_TOKEN``.
When the server cannot be reached, the batch goes to a spool file on disk (next to the
job's attempts) and is sent again with backoff; a batch carries an id, so a retry whose
first answer was lost is not counted twice. ``flush()`` sends everything now; it also runs
at interpreter exit. A script that leaves with ``os._exit`` (the gloo workaround) skips
atexit handlers, so call ``flush()`` before it.

Outside a job (no ``BATCHYARD_API``/``BATCHYARD_TOKEN``), values are printed and kept in this
process (:func:`offline_metrics`), as Azure ML's offline run did.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchyard.sdk import _spool

KINDS = ("scalar", "list", "row", "table")


@dataclass(frozen=True)
class JobContext:
    """Where a rank's metrics go, read from the environment batchyard gives every rank."""

    api: str
    token: str
    workspace: str
    experiment: str
    job: str
    attempt: int
    rank: int | None
    job_dir: str | None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> JobContext | None:
        env = dict(os.environ) if env is None else env
        needed = ("BATCHYARD_API", "BATCHYARD_TOKEN", "BATCHYARD_JOB_NAME")
        if not all(env.get(k) for k in needed):
            return None
        return cls(api=env["BATCHYARD_API"].rstrip("/"), token=env["BATCHYARD_TOKEN"],
                   workspace=env.get("BATCHYARD_WORKSPACE") or "default",
                   experiment=env.get("BATCHYARD_EXPERIMENT") or "default",
                   job=env["BATCHYARD_JOB_NAME"],
                   attempt=int(env.get("BATCHYARD_ATTEMPT") or 1), rank=current_rank(env),
                   job_dir=env.get("BATCHYARD_JOB_DIR"))

    @property
    def path(self) -> str:
        return f"/api/v1/workspaces/{self.workspace}/experiments/{self.experiment}/jobs/{self.job}"

    def spool_dir(self) -> Path:
        """Beside the attempts of the job (kept across attempts), else the temp dir."""
        configured = os.environ.get("BATCHYARD_METRICS_SPOOL")
        if configured:
            return Path(configured)
        if self.job_dir:
            return Path(self.job_dir).parent / ".metrics-spool"
        import tempfile

        return Path(tempfile.gettempdir()) / f"batchyard-metrics-{self.job}"


def current_rank(env: dict[str, str] | None = None) -> int | None:
    """The global rank: torchrun's RANK, else Open MPI's or PMI's."""
    env = dict(os.environ) if env is None else env
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "BATCHYARD_RANK"):
        value = env.get(key)
        if value and value.isdigit():
            return int(value)
    return None


def jsonable(value: Any) -> Any:
    """A JSON-safe copy: numpy/torch scalars and arrays become numbers and lists, non-finite
    floats ``{"$float": "nan"|"inf"|"-inf"}``, anything else unknown its ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars, torch tensors
    if callable(tolist):
        return jsonable(tolist())
    item = getattr(value, "item", None)
    if callable(item):
        return jsonable(item())
    return str(value)


def decode(value: Any) -> Any:
    """The inverse of :func:`jsonable` for non-finite floats."""
    if isinstance(value, dict):
        if set(value) == {"$float"}:
            return float(str(value["$float"]))
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


class Reporter:
    """Batches one process's metrics to the server from a background thread."""

    def __init__(self, ctx: JobContext, *, interval: float = 1.0, batch_size: int = 500,
                 timeout: float = 5.0, spool_dir: Path | None = None) -> None:
        self.ctx = ctx
        self.interval = interval
        self.batch_size = batch_size
        self.timeout = timeout
        self.spool = _spool.Spool(spool_dir or ctx.spool_dir(), ctx.attempt, ctx.rank)
        self._queue: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._io = threading.Lock()
        self._thread: threading.Thread | None = None
        self._retry_at = 0.0
        self._backoff = 0.5
        self._closed = False
        self._warned: set[str] = set()
        self._http: Any = None

    # caller side ----------------------------------------------------------------------------

    def emit(self, name: str, value: Any, kind: str = "scalar", step: int | None = None) -> None:
        if not isinstance(name, str) or not 0 < len(name) <= 255:
            raise ValueError("a metric name is a string of 1 to 255 characters")
        if kind not in KINDS:
            raise ValueError(f"kind: use one of {', '.join(KINDS)}")
        record = {"name": name, "value": jsonable(value), "kind": kind,
                  "step": None if step is None else int(step), "rank": self.ctx.rank,
                  "attempt": self.ctx.attempt, "ts": time.time()}
        with self._cond:
            self._queue.append(record)
            if len(self._queue) >= self.batch_size:
                self._cond.notify()
        if self._thread is None or not self._thread.is_alive():
            self._start()

    def flush(self, timeout: float = 30.0) -> bool:
        """Send everything logged so far; True when the server has all of it. On False the
        values stay in the spool file and a later flush (or attempt) sends them."""
        deadline = time.monotonic() + timeout
        while True:
            with self._io:
                self._retry_at = 0.0
                done = self._drain()
            if done:
                return True
            if time.monotonic() >= deadline:
                self._warn("flush", f"batchyard: metrics not sent yet (server unreachable); "
                           f"kept in {self.spool.path} and retried")
                return False
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def pending(self) -> int:
        with self._cond:
            queued = len(self._queue)
        return queued + self.spool.count()

    def close(self) -> None:
        self._closed = True
        with self._cond:
            self._cond.notify_all()

    # background side ------------------------------------------------------------------------

    def _start(self) -> None:
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="batchyard-metrics",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            with self._cond:
                if len(self._queue) < self.batch_size:
                    self._cond.wait(self.interval)
            with self._io:
                try:
                    self._drain()
                except Exception as exc:  # never let the thread die on a surprise
                    self._warn("thread", f"batchyard: metrics thread error: {exc!r}")

    def _take(self) -> list[dict[str, Any]]:
        with self._cond:
            batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size:]
        return batch

    def _drain(self) -> bool:
        """Send spooled batches, then the queue; True when nothing is left. Caller holds _io."""
        if time.monotonic() < self._retry_at:
            while batch := self._take():  # the server is away: keep memory small
                self.spool.append(_spool.new_batch(batch))
            return False
        if not self.spool.resend(self._send):
            return self._failed()
        while batch := self._take():
            entry = _spool.new_batch(batch)
            outcome = self._send(entry)
            if outcome == "retry":
                self.spool.append(entry)
                return self._failed()
        self._backoff = 0.5
        return self.spool.count() == 0

    def _failed(self) -> bool:
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, 30.0)
        while batch := self._take():
            self.spool.append(_spool.new_batch(batch))
        return False

    def _send(self, entry: dict[str, Any]) -> str:
        """'ok', 'retry' (server away or busy) or 'rejected' (it will never take this)."""
        import httpx

        if self._http is None:
            from batchyard.client.http import verify_for

            self._http = httpx.Client(base_url=self.ctx.api, timeout=self.timeout,
                                      verify=verify_for(self.ctx.api),
                                      headers={"Authorization": f"Bearer {self.ctx.token}"})
        try:
            resp = self._http.post(self.ctx.path + "/metrics", json=entry)
        except httpx.HTTPError:
            return "retry"
        if resp.status_code < 300:
            return "ok"
        if resp.status_code in (408, 429) or resp.status_code >= 500:
            return "retry"
        self._warn(f"rejected-{resp.status_code}", f"batchyard: the server refused metrics "
                   f"(HTTP {resp.status_code}): {resp.text[:300]}")
        return "rejected"

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(message, file=sys.stderr, flush=True)


# the process-wide reporter ----------------------------------------------------------------

_lock = threading.Lock()
_reporter: Reporter | None = None
_resolved = False
_offline: list[dict[str, Any]] = []


def reporter() -> Reporter | None:
    """This process's reporter, or None outside a job."""
    global _reporter, _resolved
    with _lock:
        if not _resolved:
            ctx = JobContext.from_env()
            _reporter = Reporter(ctx) if ctx is not None else None
            _resolved = True
            if _reporter is not None:
                atexit.register(_at_exit)
        return _reporter


def _at_exit() -> None:
    current = _reporter
    if current is not None:
        current.flush(timeout=float(os.environ.get("BATCHYARD_METRICS_EXIT_TIMEOUT", "10")))
        current.close()


def _after_fork() -> None:
    global _reporter, _resolved, _lock
    _lock = threading.Lock()
    _reporter, _resolved = None, False


os.register_at_fork(after_in_child=_after_fork)


_beat_at = -1e9


def heartbeat() -> None:
    """Tell the job's hang watchdog (``limits.hang_timeout``) that this rank makes progress,
    for a loop that neither prints nor logs metrics for long. Cheap: at most one touch of
    ``$BATCHYARD_HEARTBEAT_FILE`` a second; nothing outside a job with a hang_timeout."""
    global _beat_at
    path = os.environ.get("BATCHYARD_HEARTBEAT_FILE")
    now = time.monotonic()
    if not path or now - _beat_at < 1.0:
        return
    _beat_at = now
    try:
        os.utime(path)
    except FileNotFoundError:
        try:
            with open(path, "a"):
                pass
        except OSError:
            pass
    except OSError:
        pass


def _log(name: str, value: Any, kind: str, step: int | None) -> None:
    heartbeat()
    current = reporter()
    if current is not None:
        current.emit(name, value, kind, step)
        return
    record = {"name": name, "value": jsonable(value), "kind": kind, "step": step,
              "rank": current_rank(), "attempt": None, "ts": time.time()}
    _offline.append(record)
    at = f" (step {step})" if step is not None else ""
    print(f"Attempted to log {kind} metric {name}{at}:\n{value}", flush=True)


def log_metric(name: str, value: Any, step: int | None = None) -> None:
    """Log one value of a metric (a number, or a string), optionally at a step."""
    _log(name, value, "scalar", step)


def log_list(name: str, values: list[Any]) -> None:
    _log(name, list(values), "list", None)


def log_row(name: str, **columns: Any) -> None:
    """One row of a table metric: ``log_row("loss", epoch=1, value=0.3)``."""
    _log(name, columns, "row", None)


def log_table(name: str, table: dict[str, list[Any]]) -> None:
    """A whole table: column name -> list of values."""
    _log(name, {k: list(v) for k, v in table.items()}, "table", None)


def flush(timeout: float = 30.0) -> bool:
    """Send every metric logged so far (True outside a job: nothing to send)."""
    heartbeat()
    current = reporter()
    return True if current is None else current.flush(timeout)


def offline_metrics() -> list[dict[str, Any]]:
    """Values logged in this process outside a job."""
    return list(_offline)
