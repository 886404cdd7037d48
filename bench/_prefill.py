"""Many jobs in a bench server's store at once: rows inserted straight through the store
(one multi-row INSERT per 5,000), as submit would have stored them, copying the spec of a job
already submitted to the same cluster. Minutes of submits become seconds."""

from __future__ import annotations

import time


def prefill(db_url: str, count: int, experiment: str, cluster: str, state: str = "queued",
            start: int = 0) -> float:
    """Jobs ``{experiment}-{start}`` .. ``{experiment}-{start + count - 1}``; seconds taken.
    A finished ``state`` gets started/ended times a minute apart."""
    from sqlalchemy import insert, select

    from batchyard.server.services.jobs import job_dir
    from batchyard.store.db import Database
    from batchyard.store.models import Cluster, Experiment, Job, Workspace

    db = Database(db_url)
    t0 = time.perf_counter()
    with db.session() as s:
        ws = s.scalar(select(Workspace).where(Workspace.name == "default"))
        assert ws is not None
        exp = s.scalar(select(Experiment).where(Experiment.workspace_id == ws.id,
                                                Experiment.name == experiment))
        if exp is None:
            exp = Experiment(workspace_id=ws.id, name=experiment)
            s.add(exp)
            s.flush()
        found = s.scalar(select(Cluster).where(Cluster.name == cluster))
        assert found is not None
        template = s.scalar(select(Job.spec).where(Job.cluster_id == found.id).limit(1))
        assert template is not None, "submit one job first: its stored spec is the template"
        ids = (ws.id, exp.id, found.id)
    stamp = time.time()
    ended = state in ("succeeded", "failed", "canceled")
    for first in range(start, start + count, 5000):
        rows = []
        for i in range(first, min(start + count, first + 5000)):
            name = f"{experiment}-{i}"
            row = {"workspace_id": ids[0], "experiment_id": ids[1], "cluster_id": ids[2],
                   "name": name, "spec": {**template, "name": name, "experiment": experiment},
                   "source_format": "native", "state": state, "priority": 1,
                   "attempt": 1 if ended else 0, "cancel_requested": False,
                   "submitted_at": stamp - 120, "directory": str(job_dir("default", experiment,
                                                                          name))}
            if ended:
                row.update(started_at=stamp - 60, ended_at=stamp, exit_code=0)
            else:
                row["pending_reason"] = "waiting for the scheduler"
            rows.append(row)
        with db.session() as s:
            s.execute(insert(Job), rows)
    db.engine.dispose()
    return time.perf_counter() - t0
