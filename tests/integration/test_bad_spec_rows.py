"""One undecodable job row never stops scheduling (issue 33, item 7), and a pending reason
names the job it waits behind the way a user finds it (item 13).

With one queued job's spec set to ``this is not json`` the scheduler's read of the queue
decoded the JSON inside its SELECT: every pass failed (a traceback each 1.25 s), nothing was
scheduled, and `job list` was a 500 for everyone; a spec of JSON ``null`` made `job list` and
`job show` a 500 too (AttributeError). The rows are written while the server is down (kill -9),
as a bad restore or a hand edit would leave them, and it is started again: each bad job fails
alone naming the cause, the jobs around it run, and `job list`/`job show` show the bad rows
with ``spec_error``. PostgreSQL's json type refuses text that is not JSON, so there the first
row holds a JSON string instead (as unreadable a spec)."""

from __future__ import annotations

import os
import signal

import pytest
from sqlalchemy import text

from batchyard.store.db import Database
from yardkit import Yard, pid_alive, wait_until

pytestmark = pytest.mark.timeout(240)


def _db(yard: Yard) -> Database:
    return Database(yard.env.get("BATCHYARD_DB_URL")
                    or f"sqlite:///{yard.home / 'batchyard.db'}")


def _submit(yard: Yard, name: str, command: str, cluster: str, experiment: str,
            nodes: int = 1) -> None:
    path = yard.write_job(name, {"name": name, "nodes": nodes, "command": command,
                                 "distribution": {"type": "pytorch", "processes_per_node": 1}})
    yard.ok("job", "create", "-f", str(path), "-c", cluster, "-e", experiment)


def test_a_pending_reason_names_the_job_ahead_and_its_experiment(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "pair", "-s", "Standard_D2_v2", "-t", "2")
    yard.wait_cluster("pair", 2)
    go = yard.work / "go-pair"
    _submit(yard, "holder", f'until [ -e {go} ]; do sleep 0.1; done', "pair", "prep")
    yard.wait_job("holder", ("running",), timeout=60, experiment="prep")
    _submit(yard, "wide", "echo wide", "pair", "train", nodes=2)  # the head: both nodes
    _submit(yard, "narrow", "echo narrow", "pair", "train")  # would fit, must wait behind
    reason = wait_until(lambda: (r := yard.job("narrow", "train").get("pending_reason") or "")
                        .startswith("waiting behind") and r, 30,
                        what="narrow's reason to name the job ahead")
    assert "job wide in experiment train" in reason, reason
    wide_id = yard.job("wide", "train")["id"]
    assert f"job {wide_id} " not in reason, reason
    shown = yard.ok("job", "show", "-n", "narrow", "-e", "train").stdout
    assert "job wide in experiment train" in " ".join(shown.split()), shown
    assert yard.ok("job", "show", "-n", "wide", "-e", "train").rc == 0  # found by what it says
    go.touch()
    for name, exp in (("holder", "prep"), ("wide", "train"), ("narrow", "train")):
        assert yard.wait_job(name, timeout=60, experiment=exp)["state"] == "succeeded"


def test_an_undecodable_spec_fails_that_job_alone(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "rows", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("rows", 1)
    go = yard.work / "go-rows"
    _submit(yard, "blocker", f'until [ -e {go} ]; do sleep 0.1; done', "rows", "bad")
    yard.wait_job("blocker", ("running",), timeout=60, experiment="bad")
    for name in ("not-json", "null-spec", "after"):
        _submit(yard, name, f"echo {name} ran", "rows", "bad")
    port = int(yard.url.rsplit(":", 1)[1])
    pid = yard.server_pid
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 10, what="the server to die")
    db = _db(yard)
    postgres = db.engine.dialect.name == "postgresql"
    with db.session() as session:
        session.execute(text("UPDATE jobs SET spec = :v WHERE name = 'not-json'"),
                        {"v": '"this is not json"' if postgres else "this is not json"})
        session.execute(text("UPDATE jobs SET spec = :v WHERE name = 'null-spec'"),
                        {"v": "null"})  # JSON's null (the column is NOT NULL)
    db.engine.dispose()
    yard.start_server(port=port)

    for name in ("not-json", "null-spec"):
        failed = yard.wait_job(name, timeout=60, experiment="bad")
        assert failed["state"] == "failed", failed
        assert "cannot be scheduled" in (failed["message"] or ""), failed
        assert "spec" in failed["message"], failed
    go.touch()
    assert yard.wait_job("blocker", timeout=60, experiment="bad")["state"] == "succeeded"
    after = yard.wait_job("after", timeout=60, experiment="bad")
    assert after["state"] == "succeeded", after

    listed = {j["name"]: j for j in yard.js("job", "list", "-e", "bad")}
    assert set(listed) == {"blocker", "not-json", "null-spec", "after"}, listed
    for name in ("not-json", "null-spec"):
        assert listed[name]["spec_error"], listed[name]
        shown = yard.js("job", "show", "-n", name, "-e", "bad")
        assert shown["spec"] is None and shown["spec_error"], shown
        assert yard.ok("job", "show", "-n", name, "-e", "bad").rc == 0
    assert "spec_error" not in listed["after"]
    table = yard.ok("job", "list", "-e", "bad").stdout
    assert "null-spec" in table and "not-json" in table, table
    log = (yard.home / "server.log").read_text(errors="replace")
    assert log.count("reconciler pass failed") == 0, log[-3000:]
