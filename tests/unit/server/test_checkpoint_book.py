"""What the server keeps of the checkpoints jobs report (server/services/checkpoints.py), on
a real SQLite store migrated to 0020: the newest report of any node becomes the job's, an
older one never replaces it, a checkpoint saved in a preemption notice is passed to every
node, and the requeue says what was lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchyard.backends.base import GangStatus, NodeStatus
from batchyard.server.services import checkpoints
from batchyard.server.services.channel import control_of
from batchyard.server.services.interrupts import interrupt
from batchyard.store.db import Database
from batchyard.store.models import Attempt, Cluster, Experiment, Job, Workspace


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    with database.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        c = Cluster(workspace_id=ws.id, name="c", backend="local", spec={}, size={"vcpus": 2},
                    target_nodes=2)
        exp = Experiment(workspace_id=ws.id, name="default")
        s.add_all([c, exp])
        s.flush()
        job = Job(workspace_id=ws.id, experiment_id=exp.id, cluster_id=c.id, name="j",
                  spec={"nodes": 2, "command": "true",
                        "limits": {"checkpoint_notice": 30.0}},
                  directory=str(tmp_path / "job"))
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, number=1, uuid="u-1", state="running", node_ids=[1, 2],
                      handle={}, directory=str(tmp_path / "job" / "u-1"), started_at=1000.0))
    return database


def _status(*raws: dict[str, object]) -> GangStatus:
    return GangStatus([NodeStatus(i, "running", raw=dict(r)) for i, r in enumerate(raws)])


def test_the_newest_report_is_kept(db: Database) -> None:
    with db.session() as s:
        job = s.get(Job, 1)
        assert job is not None and job.checkpoint is None
        checkpoints.note(job, _status({}, {"checkpoint": {"at": 1050.0, "step": 50}}))
        checkpoints.note(job, _status({"checkpoint": {"at": 1100.0, "step": 100}},
                                      {"checkpoint": {"at": 1050.0, "step": 50}}))
        checkpoints.note(job, _status({"checkpoint": {"at": "soon"}}, {"checkpoint": 3}))
    with db.session() as s:
        job = s.get(Job, 1)
        assert job is not None and job.checkpoint == {"at": 1100.0, "step": 100}


def test_a_save_in_the_notice_reaches_every_node_and_the_loss_is_named(db: Database) -> None:
    with db.session() as s:
        job, attempt = s.get(Job, 1), s.get(Attempt, 1)
        assert job is not None and attempt is not None
        checkpoints.note(job, _status({"checkpoint": {"at": 1010.0, "step": 10}}))
        assert interrupt(s, job.id, "preempted", "node c-1 was preempted", 5.0)
        assert attempt.control["cancel"]["notice"] == 30.0
        checkpoints.tell_gang(job, attempt)  # the last checkpoint is from before the notice
        assert "checkpointed" not in attempt.control
        at = float(attempt.control["cancel"]["at"])
        status = _status({"checkpoint": {"at": at + 1, "step": 12}, "sigterm_at": at + 4},
                         {"sigterm_at": at + 4.2})
        checkpoints.note(job, status)
        checkpoints.tell_gang(job, attempt)
        assert attempt.control["checkpointed"]["step"] == 12
        _, seen = control_of(s, "u-1", 1)
        assert seen["checkpointed"]["step"] == 12  # node 1 hears it on its control poll
        assert checkpoints.lost_text(job, attempt, status) == \
            "preempted 3 s after its last checkpoint (step 12)"


def test_no_checkpoint_counts_from_the_attempts_start(db: Database) -> None:
    with db.session() as s:
        job, attempt = s.get(Job, 1), s.get(Attempt, 1)
        assert job is not None and attempt is not None
        text = checkpoints.lost_text(job, attempt, _status({"sigterm_at": 1090.4}))
        assert text == "preempted 90 s after its start, with no checkpoint reported"


def test_a_stop_that_is_no_preemption_gives_no_notice(db: Database) -> None:
    with db.session() as s:
        assert interrupt(s, 1, "requeue", "hung", 5.0)
        attempt = s.get(Attempt, 1)
        assert attempt is not None and attempt.control["cancel"]["notice"] == 0
