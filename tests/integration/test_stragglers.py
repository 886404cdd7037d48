"""Stragglers named (issue 36 §5): a 2-node gang of 4 ranks logs a metric at every step; rank
3 sleeps 4x longer in its step. The server names rank 3 and its node (the gang's second) on
the attempt, in `job show` and in one event, and no other rank. The window is short here
(BATCHYARD_STRAGGLER_WINDOW on the server); the default is 5 minutes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(300)

SCRIPT = """\
import os, time
import batchyard

rank = int(os.environ["RANK"])
pause = 0.8 if rank == 3 else 0.2
start, step = time.time(), 0
while time.time() - start < 25:
    time.sleep(pause)
    batchyard.log_metric("loss", 1.0 / (step + 1), step=step)
    step += 1
assert batchyard.flush(timeout=30)
"""


@pytest.fixture(scope="module")
def yard_short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    base = tmp_path_factory.mktemp("strag")
    (base / "home").mkdir()
    (base / "work").mkdir()
    y = Yard(base / "home", base / "work")
    y.env["BATCHYARD_STRAGGLER_WINDOW"] = "15"
    try:
        y.start_server()
        yield y
    finally:
        y.stop()


def test_a_rank_slowed_on_purpose_is_named_with_its_node(yard_short: Yard) -> None:
    y = yard_short
    y.ok("cluster", "create", "-n", "sg", "-s", "Standard_D2_v2", "-t", "2", "--wait")
    job_file = y.write_job("slow", {
        "name": "slow", "cluster": "sg", "nodes": 2, "code": ".",
        "distribution": {"type": "pytorch", "processes_per_node": 2},
        "command": "python steps.py"}, files={"steps.py": SCRIPT})
    y.ok("job", "create", "-f", str(job_file))

    def named() -> dict[str, Any] | None:
        job = y.job("slow")
        found = job.get("straggler")
        return job if found or job["state"] in ("succeeded", "failed", "canceled") else None

    job = wait_until(named, 120, 0.5, "a straggler to be named")
    found = job["straggler"]
    assert found and found["rank"] == 3, job
    second = next(n["node"] for n in job["attempts"][-1]["nodes"] if n["node_rank"] == 1)
    assert found["node"] == second, (found, job["attempts"][-1]["nodes"])
    assert found["ratio"] > 1.5 and found["window_s"] == 15.0, found
    shown = y.ok("job", "show", "-n", "slow").stdout
    assert "Straggler" in shown and f"rank 3 on {second}" in shown, shown
    done = y.wait_job("slow", timeout=120)
    assert done["state"] == "succeeded", done
    events = [e["message"] or "" for e in done["events"] if "straggler" in (e["message"] or "")]
    assert events and events[0].startswith(f"straggler: rank 3 on node {second} takes "), events
    assert not any("rank 0" in m or "rank 1" in m or "rank 2" in m for m in events), events
