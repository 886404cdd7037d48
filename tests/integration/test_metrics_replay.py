"""Metrics are not lost across a server restart (issue 16, item 10): a rank logs while the
server is down and exits before it is back; its values wait in the spool on the node and the
node's launcher sends them once the server returns on its port. Every value is counted."""

from __future__ import annotations

import os
import signal

import httpx

from yardkit import Yard, pid_alive, wait_until

SCRIPT = """\
import os, time
from pathlib import Path
import batchyard

for i in range(10):
    batchyard.log_metric("m", float(i), step=i)
assert batchyard.flush(timeout=30)
Path(os.environ["FIRST"]).touch()
while not Path(os.environ["DOWN"]).exists():
    time.sleep(0.1)
for i in range(10, 20):
    batchyard.log_metric("m", float(i), step=i)
batchyard.flush(timeout=2)  # the server is away: these go to the spool
Path(os.environ["DONE"]).touch()
os._exit(0)  # no atexit flush: only the node can still deliver them
"""


def test_values_logged_while_the_server_is_down_all_arrive(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "mr", "-s", "Standard_D2_v2", "-t", "1", "--wait")
    shared, mount = yard.exchange("replay-marks")  # the rank writes two of them
    marks = {k: shared / f"replay-{k.lower()}" for k in ("FIRST", "DOWN", "DONE")}
    job = yard.write_job("replay", {
        "name": "replay", "cluster": "mr", "distribution": {"type": "custom"},
        "command": "python log20.py", "code": ".", "mounts": [mount],
        "env": {k: str(v) for k, v in marks.items()}}, files={"log20.py": SCRIPT})
    yard.ok("job", "create", "-f", str(job))
    wait_until(marks["FIRST"].exists, 120, what="the first 10 values")
    port = httpx.URL(yard.url).port
    old = yard.server_pid
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: not pid_alive(old), 20)
    marks["DOWN"].touch()
    wait_until(marks["DONE"].exists, 60, what="the rank to log the rest and exit")
    yard._reset_http()
    yard.start_server(port=port or 0)  # the same address: ranks and launchers know it
    assert httpx.URL(yard.url).port == port
    done = yard.wait_job("replay", timeout=180)
    assert done["state"] == "succeeded", done
    values = yard.js("job", "metrics", "-n", "replay", "--all", "-o", "json")
    steps = sorted(int(m["step"]) for m in values if m["name"] == "m")
    assert steps == list(range(20)), steps  # every value, none twice
    launcher = (yard.attempt_dir(done) / "stdouterr" / "mr-0-launcher.txt").read_text()
    assert "spooled metrics: 10 value(s) sent" in launcher, launcher[-2000:]
