"""`workspace delete` of a workspace that ran jobs (issue 33, item 2). It deleted the jobs but
not their attempts, and the foreign key made it an internal error: every workspace that had
ever run a job, even one only `cluster diagnose` used, could not be deleted (seed 000's
clean-up step). Here the workspace has everything that hangs off a workspace: jobs with
attempts, node reports, metrics, events and idempotency keys, an array, a sweep with its
trials, a datastore, a quota, a diagnose run, a node scaled down, a job deleted before it and
a cluster deleted while its jobs still named it. Then `workspace delete` exits 0 and the
database holds exactly what it held before the workspace was made: nothing of it is left.
Runs on PostgreSQL too (scripts/test.sh)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from batchyard.store.db import Database
from batchyard.store.models import Base
from yardkit import Yard

pytestmark = pytest.mark.timeout(400)

WS = "gone"
# sign-ins, server processes: no one's; the audit trail (issue 32) is append-only history
# of who did what, and keeps the workspace's too (checked below)
SKIP_TABLES = {"portal_sessions", "servers", "audit_log"}


def _db(yard: Yard) -> Database:
    return Database(yard.env.get("BATCHYARD_DB_URL")
                    or f"sqlite:///{yard.home / 'batchyard.db'}")


def _rows(yard: Yard) -> dict[str, set[tuple[Any, ...]]]:
    db = _db(yard)
    try:
        with db.session() as session:
            return {t.name: {tuple(map(repr, row)) for row in session.execute(select(t))}
                    for t in Base.metadata.sorted_tables if t.name not in SKIP_TABLES}
    finally:
        db.engine.dispose()


def _run(yard: Yard, name: str, spec: dict[str, Any], *args: str) -> None:
    path = yard.write_job(name, {"name": name, **spec})
    yard.ok("job", "create", "-f", str(path), "-w", WS, "-c", "c1", "-e", "exp", *args)


def test_workspace_delete_after_jobs_leaves_nothing_of_it(yard: Yard) -> None:
    yard.ok("workspace", "list")  # the default workspace exists before the snapshot
    before = _rows(yard)
    yard.ok("workspace", "create", "-n", WS, "-l", "eastus")
    yard.ok("cluster", "create", "-n", "c1", "-w", WS, "-s", "Standard_D2_v2", "-t", "2")
    yard.wait_cluster("c1", 2, workspace=WS, timeout=60)
    yard.ok("experiment", "create", "-n", "exp", "-w", WS)
    yard.ok("quota", "set", "-w", WS, "--family", "standardNCFamily", "--vcpus", "12")
    store = yard.work / "store"
    store.mkdir()
    yard.ok("datastore", "register", "mine", "-w", WS, "--kind", "local",
            "--path", str(store))
    _run(yard, "metrics", {"command": "python -c \"import batchyard; "
                           "batchyard.log_metric('loss', 0.5); batchyard.flush()\"",
                           "distribution": {"type": "custom"}})
    _run(yard, "ddp", {"nodes": 2, "command": "echo rank $RANK",
                       "distribution": {"type": "pytorch", "processes_per_node": 1}})
    _run(yard, "arr", {"command": "echo index", "array": "0-2%2",
                       "distribution": {"type": "custom"}})
    _run(yard, "doomed", {"command": "exit 3", "distribution": {"type": "custom"}})
    sweep = yard.write_job("sw", {
        "name": "sw", "command": "echo lr ${{search_space.lr}}",
        "distribution": {"type": "custom"},
        "sweep": {"search_space": {"lr": {"type": "choice", "values": [0.1, 0.2]}},
                  "sampling": {"type": "grid"},
                  "objective": {"primary_metric": "loss", "goal": "minimize"},
                  "limits": {"max_total_trials": 2, "max_concurrent_trials": 2}}})
    yard.ok("sweep", "create", "-f", str(sweep), "-w", WS, "-c", "c1", "-e", "exp")
    for name in ("metrics", "ddp", "doomed", "arr_0", "arr_1", "arr_2"):
        yard.wait_job(name, timeout=120, experiment="exp", workspace=WS)
    waited = yard.cli("sweep", "wait", "-n", "sw", "-w", WS, "-e", "exp", timeout=180)
    assert waited.rc in (0, 1), str(waited)  # (no trial logs its objective: "failed")
    diagnosed = yard.cli("cluster", "diagnose", "-n", "c1", "-w", WS, "--reps", "5",
                         "--timeout", "120", timeout=180)
    assert diagnosed.rc == 0, str(diagnosed)
    yard.ok("job", "delete", "-n", "doomed", "-w", WS, "-e", "exp")
    yard.ok("cluster", "resize", "-n", "c1", "-w", WS, "-t", "1")
    yard.wait_cluster("c1", 1, workspace=WS, timeout=60)
    yard.ok("cluster", "delete", "-n", "c1", "-w", WS)

    gone = yard.cli("workspace", "delete", "-n", WS)
    assert gone.rc == 0, str(gone)
    assert "Traceback" not in gone.stderr, str(gone)
    after = _rows(yard)
    left = {name: after[name] - before.get(name, set()) for name in after
            if after[name] - before.get(name, set())}
    assert not left, f"rows of the deleted workspace left behind: {left}"
    audit = yard.js("audit", "list", "-w", WS)
    assert {"job.submit", "cluster.create", "workspace.delete"} <= \
        {e["action"] for e in audit}, audit
    assert yard.cli("workspace", "show", "-n", WS).rc == 3
    assert not (yard.home / "workspaces" / WS).exists()
