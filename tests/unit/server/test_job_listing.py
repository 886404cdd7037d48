"""Job listing: keyset pages (newest first, opaque cursor, filters in SQL), one query per
page however many experiments and clusters the rows name, and rows exactly as `job show`'s
summary. On a real SQLite store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from batchyard.errors import SpecError
from batchyard.server.services import jobs
from batchyard.spec.job import JobSpec
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
        clusters = [Cluster(workspace_id=ws.id, name=f"c{i}", backend="local", spec={},
                            size={"vcpus": 2}, target_nodes=1) for i in range(2)]
        exps = [Experiment(workspace_id=ws.id, name=f"e{i}") for i in range(3)]
        s.add_all([*clusters, *exps])
        s.flush()
        full = JobSpec.model_validate({"nodes": 2, "command": "true", "priority": "high",
                                       "distribution": {"type": "pytorch",
                                                        "processes_per_node": 2}})
        stored = full.model_dump(mode="json", exclude_none=True)
        for i in range(25):
            spec = stored if i % 5 else {"command": "true"}  # some minimal, as old rows are
            s.add(Job(workspace_id=ws.id, experiment_id=exps[i % 3].id,
                      cluster_id=clusters[i % 2].id, name=f"j{i}", spec=spec,
                      state="queued" if i % 2 else "succeeded", directory="/nonexistent",
                      submitted_at=1000.0 + i, started_at=None if i % 2 else 1000.0 + i,
                      ended_at=None if i % 2 else 1010.0 + i))
    return database


def test_pages_walk_every_job_newest_first(db: Database) -> None:
    seen: list[str] = []
    cursor = None
    pages = 0
    with db.session() as s:
        while True:
            rows, cursor = jobs.list_page(s, "default", limit=10, cursor=cursor)
            pages += 1
            seen += [r["name"] for r in rows]
            if cursor is None:
                break
    assert pages == 3
    assert seen == [f"j{i}" for i in range(24, -1, -1)]


def test_pages_are_stable_while_jobs_are_added(db: Database) -> None:
    with db.session() as s:
        first, cursor = jobs.list_page(s, "default", limit=10)
    with db.session() as s:  # a new job lands between two pages
        ws = s.query(Workspace).one()
        s.add(Job(workspace_id=ws.id, experiment_id=1, cluster_id=1, name="late",
                  spec={"command": "true"}, directory="/x"))
    with db.session() as s:
        second, _ = jobs.list_page(s, "default", limit=10, cursor=cursor)
    names = [r["name"] for r in first + second]
    assert len(set(names)) == 20 and "late" not in names


def test_filters_are_applied_in_the_query(db: Database) -> None:
    with db.session() as s:
        rows, cursor = jobs.list_page(s, "default", experiment="e1", state="queued",
                                      cluster="c1", limit=100)
    assert cursor is None
    expected = [f"j{i}" for i in range(24, -1, -1) if i % 3 == 1 and i % 2 == 1]
    assert [r["name"] for r in rows] == expected
    assert all(r["experiment"] == "e1" and r["cluster"] == "c1" and r["state"] == "queued"
               for r in rows)


def test_one_query_per_page(db: Database) -> None:
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    with db.session() as s:
        jobs.list_page(s, "default", limit=1)  # warm: the workspace row is looked up once
        event.listen(db.engine, "before_cursor_execute", count)
        try:
            statements.clear()
            jobs.list_page(s, "default", limit=25)
        finally:
            event.remove(db.engine, "before_cursor_execute", count)
    jobs_queries = [q for q in statements if "FROM jobs" in q]
    assert len(jobs_queries) == 1, statements
    assert len(statements) <= 2, statements  # + the workspace lookup


def test_rows_are_job_show_summaries(db: Database) -> None:
    with db.session() as s:
        rows, _ = jobs.list_page(s, "default", limit=100)
        everything = jobs.list_all(s, "default")
        for row in rows:
            job = s.get(Job, row["id"])
            assert job is not None
            full = jobs.job_dict(s, job)
            assert {k: v for k, v in row.items() if k != "duration"} == \
                   {k: v for k, v in full.items() if k != "duration"}
    assert [r["name"] for r in everything] == [f"j{i}" for i in range(25)]  # unpaged: oldest
    by_name = {r["name"]: r for r in rows}
    assert by_name["j1"]["priority"] == "high" and by_name["j1"]["processes_per_node"] == 2
    assert by_name["j1"]["distribution"] == "pytorch" and by_name["j1"]["nodes"] == 2
    assert by_name["j5"]["priority"] == "normal" and by_name["j5"]["nodes"] == 1  # defaults
    assert by_name["j0"]["duration"] == 10.0


@pytest.mark.parametrize("cursor", ["nonsense", "", "ajE6LTU", "x" * 40])
def test_a_bad_cursor_is_a_user_error(db: Database, cursor: str) -> None:
    with db.session() as s:
        if cursor == "":
            rows, _ = jobs.list_page(s, "default", limit=5, cursor=cursor)  # no cursor
            assert len(rows) == 5
            return
        with pytest.raises(SpecError, match="cursor"):
            jobs.list_page(s, "default", limit=5, cursor=cursor)


def test_cursors_round_trip() -> None:
    for value in (1, 99, 10**12):
        assert jobs.decode_cursor(jobs.encode_cursor(value)) == value


def test_limit_bounds(db: Database) -> None:
    with db.session() as s, pytest.raises(SpecError, match="limit"):
        jobs.list_page(s, "default", limit=0)


def test_job_show_reads_its_parents_once(db: Database) -> None:
    """`job show` loads the job with its experiment, workspace and cluster in one query, and
    the summary's names come from those rows: not read again one by one (the identity map
    holds them weakly; they were collected before the summary looked them up)."""
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    with db.session() as s:
        event.listen(db.engine, "before_cursor_execute", count)
        try:
            shown = jobs.show(s, "default", "e1", "j1")
        finally:
            event.remove(db.engine, "before_cursor_execute", count)
    assert shown["experiment"] == "e1" and shown["cluster"] == "c1"
    assert shown["workspace"] == "default"
    parents = [q for q in statements
               if any(f"FROM {table} " in q or f"FROM {table}\n" in q
                      for table in ("experiments", "workspaces", "clusters"))]
    assert parents == [], statements
    assert len(statements) == 4, statements  # the job and its parents, attempts, events, nodes
