"""The reconciler's copy of the queue (server.queue_mirror) against a real SQLite store: rows
it was not told about (another server's commits, ids committed out of order) are found by
the periodic comparison, which reads every queued id only when the count and sum of ids
disagree with the copy (or a full comparison is due anyway)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, update

from batchyard.server import queue_mirror
from batchyard.server.queue_mirror import QueueMirror
from batchyard.store.db import Database
from batchyard.store.models import Cluster, Experiment, Job, Workspace


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    with database.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        s.add_all([Cluster(workspace_id=ws.id, name="c", backend="local", spec={},
                           size={"vcpus": 2}, target_nodes=1),
                   Experiment(workspace_id=ws.id, name="e")])
        s.flush()
        for i in range(1, 11):
            s.add(Job(id=i * 10, workspace_id=ws.id, experiment_id=1, cluster_id=1,
                      name=f"j{i}", spec={"command": "true"}, state="queued",
                      directory="/nonexistent"))
    return database


def _never_bad(*_args: Any) -> None:
    raise AssertionError("no row here is bad")


def _statements(db: Database, mirror: QueueMirror) -> list[str]:
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        with db.session() as s:
            mirror.refresh(s, _never_bad)
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    return seen


def test_unannounced_changes_are_found_by_the_comparison(db: Database,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = QueueMirror()
    with db.session() as s:
        mirror.refresh(s, _never_bad)
    assert sorted(mirror.entries) == [i * 10 for i in range(1, 11)]
    with db.session() as s:  # another server: a row below the highest id, and a cancel
        s.add(Job(id=15, workspace_id=1, experiment_id=1, cluster_id=1, name="late",
                  spec={"command": "true"}, state="queued", directory="/nonexistent"))
        s.execute(update(Job).where(Job.id == 30).values(state="canceled"))
    with db.session() as s:
        mirror.refresh(s, _never_bad)
    assert 15 not in mirror.entries and 30 in mirror.entries  # not due yet
    monkeypatch.setattr(queue_mirror, "RESYNC", 0.0)
    monkeypatch.setattr(queue_mirror, "RESYNC_FACTOR", 0.0)
    with db.session() as s:
        mirror.refresh(s, _never_bad)
    assert 15 in mirror.entries and 30 not in mirror.entries


def _swap(db: Database, leaves: int, enters: int) -> None:
    """One queued job leaves and another enters: the count agrees, the sum does not."""
    with db.session() as s:
        s.execute(update(Job).where(Job.id == leaves).values(state="canceled"))
        s.add(Job(id=enters, workspace_id=1, experiment_id=1, cluster_id=1,
                  name=f"swap{enters}", spec={"command": "true"}, state="queued",
                  directory="/nonexistent"))


def test_ids_are_read_in_full_only_when_the_count_or_sum_differ(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = QueueMirror()
    with db.session() as s:
        mirror.refresh(s, _never_bad)
    monkeypatch.setattr(queue_mirror, "RESYNC", 0.0)
    monkeypatch.setattr(queue_mirror, "RESYNC_FACTOR", 0.0)
    full = "SELECT id FROM jobs WHERE state = 'queued'"
    recent = full + " AND id > "
    seen = _statements(db, mirror)  # in agreement: the count and sum only
    assert full not in seen and not any(q.startswith(recent) for q in seen)
    with db.session() as s:  # a submit committed since: the next pass's, read by its id
        s.add(Job(id=500, workspace_id=1, experiment_id=1, cluster_id=1, name="new",
                  spec={"command": "true"}, state="queued", directory="/nonexistent"))
    seen = _statements(db, mirror)
    assert full not in seen and not any(q.startswith(recent) for q in seen)
    assert 500 in mirror.entries
    _swap(db, leaves=20, enters=25)  # among the recent ids: mended without a full read
    seen = _statements(db, mirror)
    assert any(q.startswith(recent) for q in seen) and full not in seen
    assert 25 in mirror.entries and 20 not in mirror.entries
    monkeypatch.setattr(queue_mirror, "RECENT", 0)  # out of the recent window: in full
    _swap(db, leaves=40, enters=45)
    assert full in _statements(db, mirror)
    assert 45 in mirror.entries and 40 not in mirror.entries
    monkeypatch.setattr(queue_mirror, "FULL_RESYNC", 0.0)  # due anyway
    assert full in _statements(db, mirror)


def _runs_hold_the_entries(mirror: QueueMirror) -> None:
    kept = sorted((job.id, job.seq) for run in mirror.runs.ordered() for job in run.jobs)
    assert kept == sorted((e.view.id, e.view.seq) for e in mirror.entries.values())
    assert len(mirror.runs) == len(mirror.entries)
    for run in mirror.runs.ordered():  # each in submit order, its ids and sizes alongside
        assert [j.seq for j in run.jobs] == sorted(j.seq for j in run.jobs)
        assert run.ids == [j.id for j in run.jobs] and run.sizes == [j.nodes for j in run.jobs]
        assert all(e.view is j for j in run.jobs for e in [mirror.entries[j.id]])


def test_the_fair_walks_runs_follow_the_entries(db: Database,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy keeps its views cut into the fair walk's runs (scheduler.runs) as rows enter,
    leave and change, so that a pass over the whole queue hands them over as they are."""
    mirror = QueueMirror()
    with db.session() as s:
        mirror.refresh(s, _never_bad)
    _runs_hold_the_entries(mirror)
    monkeypatch.setattr(queue_mirror, "RESYNC", 0.0)
    monkeypatch.setattr(queue_mirror, "RESYNC_FACTOR", 0.0)
    _swap(db, leaves=20, enters=25)
    with db.session() as s:  # a queued row changed: its priority, so another run
        s.execute(update(Job).where(Job.id == 60).values(priority=2))
    queue_mirror.mark_dirty(60)
    with db.session() as s:
        mirror.refresh(s, _never_bad)
    assert 25 in mirror.entries and 20 not in mirror.entries
    assert mirror.entries[60].view.priority == 2
    _runs_hold_the_entries(mirror)
    mirror.discard(70)
    _runs_hold_the_entries(mirror)
