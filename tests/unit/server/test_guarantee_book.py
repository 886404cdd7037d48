"""What the scheduling pass reads of guarantees (server.guarantee_book) against a real
SQLite store migrated to 0019: with none set a pass reads nothing (the rows are read again
only after a change here or every REFRESH seconds) and builds no view; a change here is seen
by the next pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from batchyard.scheduler import JobView
from batchyard.server import guarantee_book
from batchyard.server.fairshare_book import ACCOUNTS
from batchyard.server.guarantee_book import GuaranteeBook
from batchyard.server.services.guarantees import set_guarantee
from batchyard.store.db import Database
from batchyard.store.identity import Team, TeamMember, User
from batchyard.store.models import Cluster, Workspace


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    with database.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        s.add(Cluster(workspace_id=ws.id, name="gpu", backend="local", spec={},
                      size={"vcpus": 24, "gpus": 4}, target_nodes=4))
        team, user = Team(name="vision"), User(name="ann")
        s.add_all([team, user])
        s.flush()
        s.add(TeamMember(team_id=team.id, user_id=user.id))
    return database


def _reads(db: Database, book: GuaranteeBook) -> list[str]:
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        with db.session() as s:
            book.refresh(s)
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    return seen


def test_no_guarantee_costs_no_pass_anything(db: Database) -> None:
    book = GuaranteeBook()
    assert len(_reads(db, book)) == 1  # the first pass reads the (empty) table once
    for _ in range(50):
        assert _reads(db, book) == []
    assert book.view({1}, [], []) is None


def test_a_guarantee_set_here_is_seen_by_the_next_pass(db: Database) -> None:
    book = GuaranteeBook()
    _reads(db, book)
    version = book.version
    with db.session() as s:
        made = set_guarantee(s, "default", "gpu", "vision", 8, None, 4)
    assert (made["nodes"], made["guaranteed"], made["borrow_limit"]) == (2, 8, 4)
    assert _reads(db, book) and book.version == version + 1
    ann = ACCOUNTS.id_of("ann")
    view = book.view({1}, [JobView(1, 1, 1, 1, 1, 1, 1, account=ann)], [])
    assert view is not None
    assert view.clusters[1]["vision"].nodes == 2 and view.clusters[1]["vision"].borrow_limit == 1
    assert view.team_of == {ann: "vision"}
    assert book.view({2}, [], []) is None  # a cluster without guarantees: nothing to do
    guarantee_book.changed()
    assert _reads(db, book) and book.version == version + 1  # read again, nothing changed


def test_a_workspace_purged_takes_its_clusters_guarantees(db: Database) -> None:
    """Guarantees are keyed by (cluster, team): the workspace's purge (found from the
    schema's foreign keys) deletes them by their cluster, and keeps the team."""
    from sqlalchemy import func, select

    from batchyard.store.identity import Guarantee
    from batchyard.store.models import Base
    from batchyard.store.purge import purge

    with db.session() as s:
        set_guarantee(s, "default", "gpu", "vision", 8, None, None)
    with db.session() as s:
        ws = s.scalar(select(Workspace.id).where(Workspace.name == "default"))
        gone = purge(s, Base.metadata.tables["workspaces"], [ws])
    assert gone["guarantees"] == 1 and gone["clusters"] == 1, gone
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(Guarantee)) == 0
        assert s.scalar(select(func.count()).select_from(Team)) == 1
