"""What makes the reconciler look at an attempt (server/followups.py): a change to it, once
its transaction has committed (never one rolled back), a report that says something new
(not a usage sample), a node report marked lost, a terminate of its job; and another server
process hears of it when this one does not reconcile."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchyard.server import followups, notify
from batchyard.server.services import channel
from batchyard.store.db import Database
from batchyard.store.models import Attempt, Cluster, Experiment, Job, NodeReport, Workspace


@pytest.fixture()
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    return database


@pytest.fixture()
def woken() -> Iterator[list[bool]]:
    calls: list[bool] = []
    followups.configure(lambda: calls.append(True))
    followups.take()
    yield calls
    followups.configure(None)
    followups.take()


def _attempt(db: Database, tmp_path: Path) -> tuple[int, int, str]:
    """(attempt id, job id, attempt uuid) of a running attempt with one node report."""
    with db.session() as s:
        ws = s.query(Workspace).filter_by(name="default").one_or_none() or Workspace(
            name="default")
        s.add(ws)
        s.flush()
        exp = Experiment(workspace_id=ws.id, name="e")
        cluster = Cluster(workspace_id=ws.id, name="c", backend="local", spec={}, size={})
        s.add_all([exp, cluster])
        s.flush()
        job = Job(workspace_id=ws.id, experiment_id=exp.id, cluster_id=cluster.id, name="j",
                  spec={"command": "true"}, state="running", directory=str(tmp_path / "j"))
        s.add(job)
        s.flush()
        attempt = Attempt(job_id=job.id, number=1, uuid=str(uuid.uuid4()), state="running",
                          node_ids=[1], handle={}, directory=str(tmp_path / "a"))
        s.add(attempt)
        s.flush()
        s.add(NodeReport(attempt_id=attempt.id, node_rank=0, node_id=1, token_hash="x",
                         seq=0, state="running", data={"state": "running"}))
        return attempt.id, job.id, attempt.uuid


def test_a_change_is_marked_once_committed_and_never_when_rolled_back(
        db: Database, tmp_path: Path, woken: list[bool]) -> None:
    attempt_id, _, _ = _attempt(db, tmp_path)
    followups.take()
    with db.session() as s:
        attempt = s.get(Attempt, attempt_id)
        assert attempt is not None
        channel.update_control(attempt, cancel={"state": "canceled"})
        assert followups.take() == (set(), set(), False)  # not before the commit
    assert followups.take()[0] == {attempt_id} and woken
    with db.session() as s:
        attempt = s.get(Attempt, attempt_id)
        assert attempt is not None
        channel.update_control(attempt, abort={"message": "x"})
        s.rollback()
    assert followups.take()[0] == set()


def test_a_usage_sample_is_no_news_and_a_new_state_is(db: Database, tmp_path: Path,
                                                      woken: list[bool]) -> None:
    attempt_id, _, attempt_uuid = _attempt(db, tmp_path)
    followups.take()
    sample = {"state": "running", "util": {"cpu_percent": 3.0}, "updated_at": 1.0}
    with db.session() as s:
        channel.apply_report(s, attempt_uuid, 0, 1, sample)
    assert followups.take()[0] == set()
    with db.session() as s:
        channel.apply_report(s, attempt_uuid, 0, 2, {**sample, "util": {"cpu_percent": 9.0},
                                                     "updated_at": 2.0})
    assert followups.take()[0] == set()
    with db.session() as s:  # the hang watchdog's verdict, same state
        channel.apply_report(s, attempt_uuid, 0, 3, {**sample, "idle": True})
    assert followups.take()[0] == {attempt_id}
    with db.session() as s:
        channel.apply_report(s, attempt_uuid, 0, 4, {**sample, "idle": True,
                                                     "state": "succeeded"})
    assert followups.take()[0] == {attempt_id}


def test_a_report_marked_lost_and_a_terminate_are_marked(db: Database, tmp_path: Path,
                                                         woken: list[bool]) -> None:
    attempt_id, job_id, _ = _attempt(db, tmp_path)
    followups.take()
    with db.session() as s:
        row = s.query(NodeReport).filter_by(attempt_id=attempt_id).one()
        row.state = "lost"  # as an agent's heartbeat marks a dead launcher
    assert followups.take()[0] == {attempt_id}
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.cancel_requested = True
    assert followups.take()[1] == {job_id}


def test_another_process_hears_of_it_only_when_this_one_does_not_lead(
        db: Database, tmp_path: Path) -> None:
    sent: list[str] = []
    notify.set_relay(sent.append)
    leading = [True]
    followups.configure(None, lambda: leading[0])
    try:
        attempt_id, job_id, _ = _attempt(db, tmp_path)
        followups.take()
        followups.attempt(None, attempt_id)
        assert sent == []
        leading[0] = False
        followups.attempt(None, attempt_id)
        followups.job(None, job_id)
        assert sent == [f"follow a{attempt_id}", f"follow j{job_id}"]
        followups.take()
        notify.deliver(f"follow a{attempt_id}", lambda: None, lambda _i: None)
        notify.deliver("follow *", lambda: None, lambda _i: None)
        assert followups.take() == ({attempt_id}, set(), True)
        assert len(sent) == 2  # what others announce is not announced again
    finally:
        notify.set_relay(None)
        followups.configure(None)
        followups.take()
