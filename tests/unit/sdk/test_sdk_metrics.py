"""The in-job metrics reporter: value conversion, the job context from the environment, and
batching / spooling / retrying against a small HTTP endpoint that records what it receives
(the real server is exercised by tests/integration/test_sdk.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchyard.sdk import metrics
from batchyard.sdk._spool import Spool, new_batch
from batchyard.sdk.metrics import JobContext, Reporter, decode, jsonable


class Endpoint:
    """Records metric batches; answers with ``status`` (and sleeps ``delay`` first)."""

    def __init__(self) -> None:
        self.status = 201
        self.delay = 0.0
        self.batches: dict[str, list[dict[str, Any]]] = {}
        self.posts = 0
        self.paths: set[str] = set()
        self.auth: set[str] = set()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(endpoint.delay)
                endpoint.posts += 1
                endpoint.paths.add(self.path)
                endpoint.auth.add(self.headers.get("Authorization", ""))
                if endpoint.status < 300:
                    endpoint.batches.setdefault(body["batch"], body["metrics"])
                self.send_response(endpoint.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def received(self) -> list[dict[str, Any]]:
        return [m for batch in self.batches.values() for m in batch]


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    ep = Endpoint()
    yield ep
    ep.server.shutdown()


def context(api: str, rank: int | None = 0) -> JobContext:
    return JobContext(api=api, token="job.secret", workspace="w", experiment="e", job="j1",
                      attempt=1, rank=rank, job_dir=None)


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_jsonable_and_decode_round_trip() -> None:
    value = {"a": np.float32(0.5), "b": np.arange(3), "c": (1, float("nan")),
             "d": float("inf"), "e": [float("-inf")], "f": "text", "g": True}
    converted = jsonable(value)
    json.dumps(converted, allow_nan=False)  # valid strict JSON
    assert converted["a"] == 0.5 and converted["b"] == [0, 1, 2]
    assert converted["c"][1] == {"$float": "nan"} and converted["d"] == {"$float": "inf"}
    back = decode(converted)
    assert math.isnan(back["c"][1]) and back["d"] == math.inf and back["e"] == [-math.inf]
    assert back["f"] == "text" and back["g"] is True


def test_job_context_from_env_and_rank() -> None:
    assert JobContext.from_env({}) is None
    env = {"BATCHYARD_API": "http://h:1/", "BATCHYARD_TOKEN": "job.t", "BATCHYARD_JOB_NAME": "j",
           "BATCHYARD_WORKSPACE": "w", "BATCHYARD_EXPERIMENT": "e", "BATCHYARD_ATTEMPT": "2",
           "OMPI_COMM_WORLD_RANK": "3", "BATCHYARD_JOB_DIR": "/x/jobs/j/uuid"}
    ctx = JobContext.from_env(env)
    assert ctx is not None and ctx.rank == 3 and ctx.attempt == 2 and ctx.api == "http://h:1"
    assert ctx.path == "/api/v1/workspaces/w/experiments/e/jobs/j"
    assert ctx.spool_dir() == Path("/x/jobs/j/.metrics-spool")
    assert metrics.current_rank({"RANK": "1", "OMPI_COMM_WORLD_RANK": "5"}) == 1


def test_offline_logging_prints_and_keeps(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("BATCHYARD_API", "BATCHYARD_TOKEN", "BATCHYARD_JOB_NAME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(metrics, "_resolved", False)
    metrics.log_metric("offline_acc", 0.75, step=2)
    metrics.log_row("offline_row", epoch=1, loss=0.5)
    assert metrics.flush() is True
    out = capsys.readouterr().out
    assert "offline_acc" in out and "0.75" in out
    kept = [m for m in metrics.offline_metrics() if m["name"].startswith("offline_")]
    assert [m["kind"] for m in kept[-2:]] == ["scalar", "row"]


def test_batches_sent_in_background_with_job_token(endpoint: Endpoint, tmp_path: Path) -> None:
    rep = Reporter(context(endpoint.url), interval=0.1, batch_size=500, spool_dir=tmp_path)
    for i in range(1200):
        rep.emit("loss", 1.0 / (i + 1), step=i)
    deadline = time.monotonic() + 10
    while len(endpoint.received()) < 1200 and time.monotonic() < deadline:
        time.sleep(0.05)
    got = endpoint.received()
    assert len(got) == 1200  # no flush() call: the background thread sent them
    assert max(len(b) for b in endpoint.batches.values()) <= 500
    assert [m["step"] for m in got] == list(range(1200))
    assert endpoint.paths == {"/api/v1/workspaces/w/experiments/e/jobs/j1/metrics"}
    assert endpoint.auth == {"Bearer job.secret"}
    assert got[0]["rank"] == 0 and got[0]["attempt"] == 1 and got[0]["kind"] == "scalar"
    rep.close()


def test_emit_never_blocks_on_a_slow_server(endpoint: Endpoint, tmp_path: Path) -> None:
    # One send waited for would take the whole delay (20 s): the bound is half of it, far
    # above what 2,000 emits take even on a loaded 2-core machine. How fast emits are is
    # measured by bench/sdk_emit.py (against a plain queue in the same run), not here.
    endpoint.delay = 20.0
    rep = Reporter(context(endpoint.url), interval=0.05, batch_size=10, spool_dir=tmp_path)
    began = time.perf_counter()
    for i in range(2000):
        rep.emit("x", i)
    assert time.perf_counter() - began < 10.0
    endpoint.delay = 0.0
    assert rep.flush(timeout=20)
    assert len(endpoint.received()) == 2000
    rep.close()


def test_server_down_spools_then_sends_each_value_once(endpoint: Endpoint,
                                                       tmp_path: Path) -> None:
    endpoint.status = 503
    rep = Reporter(context(endpoint.url), interval=0.05, spool_dir=tmp_path)
    for i in range(30):
        rep.emit("acc", i / 30, step=i)
    assert rep.flush(timeout=0.5) is False
    assert rep.spool.path.is_file() and rep.pending() == 30
    spooled = [json.loads(line) for line in rep.spool.path.read_text().splitlines()]
    assert sum(len(b["metrics"]) for b in spooled) == 30
    endpoint.status = 201
    assert rep.flush(timeout=10) is True
    assert not rep.spool.path.exists() and rep.pending() == 0
    assert sorted(m["step"] for m in endpoint.received()) == list(range(30))
    rep.close()


def test_unreachable_server_keeps_values_on_disk(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rep = Reporter(context(closed_port_url()), interval=0.05, spool_dir=tmp_path)
    rep.emit("a", 1.0)
    rep.emit("b", [1, 2])
    assert rep.flush(timeout=0.3) is False
    assert "kept in" in capsys.readouterr().err
    lines = rep.spool.path.read_text().splitlines()
    assert {m["name"] for line in lines for m in json.loads(line)["metrics"]} == {"a", "b"}
    rep.close()


def test_spool_of_a_dead_process_is_adopted(endpoint: Endpoint, tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    orphan = Spool(tmp_path, 1, 0)
    orphan.path = tmp_path / f"{orphan.host}-{dead_pid}-a1-r0.jsonl"
    orphan.append(new_batch([{"name": "before_crash", "value": 1.0, "kind": "scalar"}]))
    rep = Reporter(context(endpoint.url), interval=0.05, spool_dir=tmp_path)
    rep.emit("after_restart", 2.0)
    assert rep.flush(timeout=10)
    assert {m["name"] for m in endpoint.received()} == {"before_crash", "after_restart"}
    assert not list(tmp_path.glob("*.jsonl*"))
    rep.close()


def test_rejected_batch_is_dropped_with_a_warning(endpoint: Endpoint, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    endpoint.status = 403
    rep = Reporter(context(endpoint.url), interval=0.05, spool_dir=tmp_path)
    rep.emit("x", 1)
    assert rep.flush(timeout=5) is True  # nothing left to retry
    assert "refused metrics (HTTP 403)" in capsys.readouterr().err
    rep.close()


def test_bad_names_and_kinds_fail_in_the_caller(tmp_path: Path) -> None:
    rep = Reporter(context(closed_port_url()), spool_dir=tmp_path)
    with pytest.raises(ValueError):
        rep.emit("", 1)
    with pytest.raises(ValueError):
        rep.emit("x", 1, kind="image")
