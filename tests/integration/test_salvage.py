"""A launcher killed with SIGKILL leaves lines on its node's disk that it never sent: whoever
sweeps after it (here the local backend) ships them with the dead launcher's own ticket, so
the server's copy keeps every line written before the end, exactly once."""

from __future__ import annotations

import os
import signal

import pytest

from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(120)

LINES = 40
# Rank 1 waits for a go file, prints its lines, then says so and sleeps.
COMMAND = (
    'if [ "$RANK" = 1 ]; then '
    'while [ ! -e "$AZ_BATCHAI_SHARED_JOB_TEMP/go" ]; do sleep 0.05; done; '
    f'for i in $(seq 1 {LINES}); do echo "salvaged line $i"; done; '
    'touch "$AZ_BATCHAI_SHARED_JOB_TEMP/printed"; fi; sleep 60'
)


def test_lines_of_a_killed_launcher_reach_the_server(yard: Yard, cluster2: str) -> None:
    path = yard.write_job("salvage", {"name": "salvage", "nodes": 2, "command": COMMAND,
                                      "distribution": {"type": "pytorch",
                                                       "processes_per_node": 1},
                                      "limits": {"grace_period": 2}})
    yard.ok("job", "create", "-f", str(path), "-c", cluster2)
    job = yard.wait_job("salvage", ("running",), timeout=60)
    node1 = yard.node_attempt_dirs(job)[1] / "shared"
    wait_until(lambda: all(r.get("pid") for r in yard.node_reports(yard.job("salvage"))), 10,
               what="both launchers to report their pid")
    launcher = int(yard.node_reports(yard.job("salvage"))[1]["pid"])
    os.kill(launcher, signal.SIGSTOP)  # frozen: it can no longer ship what rank 1 prints
    (node1 / "go").touch()
    wait_until(lambda: (node1 / "printed").exists(), 20, what="rank 1 to print its lines")
    os.kill(launcher, signal.SIGKILL)
    done = yard.wait_job("salvage", timeout=60)
    assert done["state"] == "failed" and "died" in (done["message"] or ""), done

    def all_lines() -> bool:
        out = yard.ok("job", "logs", "-n", "salvage", "--rank", "1").stdout
        return out.count("salvaged line") >= LINES

    wait_until(all_lines, 30, what="the killed launcher's lines to reach the server")
    out = yard.ok("job", "logs", "-n", "salvage", "--rank", "1").stdout
    got = [line.split()[-1] for line in out.splitlines() if "salvaged line" in line]
    assert got == [str(i) for i in range(1, LINES + 1)], got  # every line, exactly once
    yard.assert_no_process_left(done)
