"""One bad object never stops scheduling (hardening item 2). A cluster whose setup task held a
NUL byte (the API accepted it once) made every reconciler pass fail and roll back, and jobs on
every other cluster stayed queued. Rows like that can still be in a database written by an
older server, so this test writes them there while the server is down (kill -9) and starts it
again: a cluster whose nodes cannot be reconciled, a cluster whose size cannot be read, and a
queued job whose spec cannot be scheduled. Each ends in an error state naming why; every other
job runs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from batchyard.store.db import Database
from batchyard.store.models import Cluster, Event, Job, Node
from yardkit import Yard, pid_alive, wait_until

pytestmark = pytest.mark.timeout(240)


def _db_url(yard: Yard) -> str:
    return yard.env.get("BATCHYARD_DB_URL") or f"sqlite:///{yard.home / 'batchyard.db'}"


def test_one_bad_cluster_or_job_never_stops_the_others(yard: Yard) -> None:
    for name in ("good", "bad-setup", "bad-size"):
        yard.ok("cluster", "create", "-n", name, "-s", "Standard_D2_v2", "-t", "1",
                "--setup-task", "echo ready")
        yard.wait_cluster(name, 1)
    go = yard.work / "go"
    blocker = yard.write_job("blocker", {"name": "blocker", "command":
                                         'until [ -e "$GO" ]; do sleep 0.1; done',
                                         "env": {"GO": str(go)}})
    yard.ok("job", "create", "-f", str(blocker), "-c", "good")
    yard.wait_job("blocker", ("running",), timeout=60)
    for name in ("victim", "after"):
        path = yard.write_job(name, {"name": name, "command": f"echo {name} ran"})
        yard.ok("job", "create", "-f", str(path), "-c", "good")
    assert yard.job("victim")["state"] == "queued"
    port = int(yard.url.rsplit(":", 1)[1])

    pid = yard.server_pid
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 10, what="the server to die")
    db = Database(_db_url(yard))
    with db.session() as session:
        bad_setup = session.query(Cluster).filter_by(name="bad-setup").one()
        bad_setup.spec = {**bad_setup.spec, "setup_task": {"command": "echo \x00", "env": {}}}
        for node in session.query(Node).filter_by(cluster_id=bad_setup.id):
            node.state, node.ready_at = "preparing", 0.0
            node.resources = {k: v for k, v in node.resources.items() if k != "setup_started"}
        bad_size = session.query(Cluster).filter_by(name="bad-size").one()
        bad_size.size = {**bad_size.size, "vcpus": "many"}
        victim = session.query(Job).filter_by(name="victim").one()
        victim.spec = {**victim.spec, "nodes": "two"}
    db.engine.dispose()
    yard.start_server(port=port)

    failed = yard.wait_job("victim", timeout=60)
    assert failed["state"] == "failed", failed
    assert "cannot be scheduled" in (failed["message"] or ""), failed
    go.touch()
    assert yard.wait_job("blocker", timeout=60)["state"] == "succeeded"
    after = yard.wait_job("after", timeout=60)
    assert after["state"] == "succeeded", after
    assert "after ran" in yard.ok("job", "logs", "-n", "after").stdout

    broken = wait_until(lambda: (c := yard.cluster("bad-setup")).get("errors") and c, 30,
                        what="bad-setup to show its error")
    assert "NUL" in str(broken["errors"]) or "null" in str(broken["errors"]), broken
    sized = wait_until(lambda: (c := yard.cluster("bad-size")).get("errors") and c, 30,
                       what="bad-size to show its error")
    assert "many" in str(sized["errors"]), sized
    time.sleep(1.5)  # several passes: the error is recorded once, not on every pass
    with db.session() as session:
        errors = session.scalars(select(Event.message).where(
            Event.kind == "cluster", Event.to_state == "error")).all()
    db.engine.dispose()
    assert len(errors) == 2, errors

    # a new cluster and job after all that: scheduling goes on
    yard.ok("cluster", "create", "-n", "later", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("later", 1)
    path: Path = yard.write_job("late", {"name": "late", "command": "echo late ran"})
    yard.ok("job", "create", "-f", str(path), "-c", "later")
    assert yard.wait_job("late", timeout=60)["state"] == "succeeded"
    shown = yard.ok("cluster", "show", "-n", "bad-setup").stdout
    assert "reconciling" in shown.lower() or "error" in shown.lower(), shown
