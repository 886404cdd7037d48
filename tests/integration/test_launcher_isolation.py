"""Losing one node launcher takes down only its own job. The local backend sweeps what a dead
launcher left by that launcher's process tag; it once swept the server's descendants instead,
which are every launcher and rank forked through the zygote, on every cluster of every
workspace. Two workspaces, a cluster and a job in each; kill -9 one launcher of the job on
cluster B: that job fails naming its node, and the job on cluster A runs on and succeeds."""

from __future__ import annotations

import os
import signal

import pytest

from yardkit import Yard, pid_alive, wait_until

pytestmark = pytest.mark.timeout(240)


def test_a_killed_launcher_takes_down_only_its_own_job(yard: Yard) -> None:
    for ws, cluster, nodes in (("wsa", "ca", 1), ("wsb", "cb", 2)):
        yard.ok("workspace", "create", "-n", ws)
        yard.ok("cluster", "create", "-n", cluster, "-w", ws, "-s", "Standard_D2_v2", "-t",
                str(nodes))
        yard.wait_cluster(cluster, nodes, workspace=ws, timeout=60)
    marker = yard.work / "a.go"
    path_a = yard.write_job("ja", {"name": "ja", "command": 'echo running; until [ -e "$GO" ]; '
                                   'do sleep 0.1; done; echo survived',
                                   "env": {"GO": str(marker)}})
    path_b = yard.write_job("jb", {"name": "jb", "nodes": 2, "command": "sleep 120",
                                   "limits": {"grace_period": 2}})
    yard.ok("job", "create", "-f", str(path_a), "-c", "ca", "-w", "wsa")
    yard.ok("job", "create", "-f", str(path_b), "-c", "cb", "-w", "wsb")

    def reported(name: str, ws: str, count: int) -> list[dict] | None:
        job = yard.job(name, workspace=ws)
        if job["state"] != "running":
            return None
        reports = yard.node_reports(job)
        ok = len(reports) == count and all(r.get("pid") and r.get("ranks") for r in reports)
        return reports if ok else None

    a_reports = wait_until(lambda: reported("ja", "wsa", 1), 60, what="job A's launcher")
    b_reports = wait_until(lambda: reported("jb", "wsb", 2), 60, what="job B's launchers")
    a_pids = yard.recorded_pids(yard.job("ja", workspace="wsa"))
    assert len(a_pids) >= 2 and a_reports
    victim = next(r for r in b_reports if r["node_rank"] == 1)
    os.kill(int(victim["pid"]), signal.SIGKILL)
    b_done = yard.wait_job("jb", workspace="wsb", timeout=60)
    yard.assert_no_process_left(b_done)
    # the sweep after B's launcher is over: A's launcher and rank are untouched
    assert [p for p in a_pids if pid_alive(p)] == a_pids, (a_pids, b_done)
    assert yard.job("ja", workspace="wsa")["state"] == "running"
    assert b_done["state"] == "failed", b_done
    assert victim["node"] in (b_done["message"] or ""), b_done
    marker.touch()
    a_done = yard.wait_job("ja", workspace="wsa", timeout=60)
    assert a_done["state"] == "succeeded", a_done
    logs = yard.ok("job", "logs", "-n", "ja", "-w", "wsa").stdout
    assert "survived" in logs, logs
