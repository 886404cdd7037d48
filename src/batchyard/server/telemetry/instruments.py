"""The counters and histograms a server process updates as it works: submit latency, the
scheduling pass, node-channel errors. A ``--workers`` server's processes each count their own
share; prometheus-client's multi-process mode keeps every process's values in small files
of one directory (``prepare``), and a scrape on any worker adds them all up, so /metrics
reports the whole server. prometheus-client is imported on first use only."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
SUBMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0)
# What a node-channel error is counted under: the call, never a path (ids would make the
# label set unbounded).
CHANNEL_CALLS = frozenset({"plan", "status", "logs", "control", "outputs", "snapshots",
                           "rendezvous", "relay", "stacks", "preflight", "exec", "join",
                           "heartbeat", "commands"})


def prepare(folder: Path) -> None:
    """Called once by the server's first process, before any worker starts: an empty folder
    for this run's multi-process files (the workers inherit the variable)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)
    os.environ[MULTIPROC_ENV] = str(folder)


def multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


class Instruments:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, values

        if multiprocess() and not getattr(values.ValueClass, "_multiprocess", False):
            values.ValueClass = values.get_value_class()  # imported before the variable
        # multi-process: the values live in files (a scrape reads them all); otherwise in
        # this registry of the process's own
        self.own: CollectorRegistry | None = None if multiprocess() else CollectorRegistry()
        self.submit_latency = Histogram(
            "batchyard_submit_latency_seconds",
            "Time to answer a job submit (request in to answer out).",
            buckets=SUBMIT_BUCKETS, registry=self.own)
        self.scheduling_pass = Histogram(
            "batchyard_scheduling_pass_seconds",
            "Duration of one scheduling pass of the reconciler (the queue against the nodes).",
            buckets=PASS_BUCKETS, registry=self.own)
        self.channel_errors = Counter(
            "batchyard_node_channel_errors",
            "Node-channel calls (launchers, agents) the server answered with an error.",
            labelnames=("call", "code"), registry=self.own)


_instruments: Instruments | None = None
_lock = threading.Lock()


def get() -> Instruments:
    global _instruments
    if _instruments is None:
        with _lock:
            if _instruments is None:
                _instruments = Instruments()
    return _instruments


def observe_submit(seconds: float) -> None:
    get().submit_latency.observe(seconds)


def observe_pass(seconds: float) -> None:
    get().scheduling_pass.observe(seconds)


def count_channel_error(call: str, status: int) -> None:
    get().channel_errors.labels(call if call in CHANNEL_CALLS else "other",
                                str(status)).inc()


def collectors() -> list[Any]:
    """What a scrape reads of the instruments: every process's files, or this process's."""
    instruments = get()
    if instruments.own is not None:
        return [instruments.own]
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    holder = CollectorRegistry()
    MultiProcessCollector(holder)
    return [holder]


def scrape_registry(extra: list[Any]) -> CollectorRegistry:
    """A registry holding the instruments and ``extra`` collectors."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    for collector in [*collectors(), *extra]:
        registry.register(_Relay(collector))
    return registry


class _Relay:
    """A registry (or collector) seen as one collector by another registry."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def collect(self) -> Any:
        return self.inner.collect()
