"""What a server process tells the others on its database (server/notify.py's relay): a
change made in a transaction is announced once that transaction commits, never when it
rolls back; exec sessions' wake-ups stay in their process; and what another process
announces wakes this one's long polls without being announced again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from batchyard.server import notify, queue_mirror
from batchyard.store.db import Database


@pytest.fixture()
def relayed() -> Iterator[list[str]]:
    sent: list[str] = []
    notify.set_relay(sent.append)
    yield sent
    notify.set_relay(None)


@pytest.fixture()
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    return database


def test_a_change_is_announced_after_its_commit(relayed: list[str], db: Database) -> None:
    with db.session() as session:
        session.connection()
        queue_mirror.changed(session, 41)
        notify.bump("attempt-a", session)
        assert "dirty 41" not in relayed and "bump attempt-a" not in relayed
        session.commit()
        assert sorted(relayed) == ["bump attempt-a", "dirty 41"]
    assert 41 in queue_mirror._take_dirty()  # and this process's own reconciler knows now


def test_a_rolled_back_change_is_never_announced(relayed: list[str], db: Database) -> None:
    with db.session() as session:
        session.connection()
        queue_mirror.changed(session, 42)
        session.rollback()
        session.connection()
        session.commit()
    assert relayed == []
    queue_mirror._take_dirty()


def test_exec_wakeups_stay_here_and_others_are_sent_now(relayed: list[str]) -> None:
    notify.bump("exec-in:abc")
    notify.bump("node:3")
    notify.logs_arrived()
    assert relayed == ["bump node:3", "logs"]


def test_what_others_announce_wakes_here_without_an_echo(relayed: list[str]) -> None:
    kicked: list[bool] = []
    dirty: list[int] = []
    before = notify.version("attempt-b")
    other = notify.version("never-bumped")
    notify.deliver("bump attempt-b", lambda: kicked.append(True), dirty.append)
    assert notify.version("attempt-b") == before + 1
    notify.deliver("kick", lambda: kicked.append(True), dirty.append)
    notify.deliver("dirty 7", lambda: kicked.append(True), dirty.append)
    notify.deliver("dirty x", lambda: kicked.append(True), dirty.append)  # ignored
    assert kicked == [True] and dirty == [7]
    notify.deliver("bump *", lambda: None, dirty.append)  # a gap: every key moves
    assert notify.version("never-bumped") == other + 1
    assert relayed == []


def test_a_follower_marks_its_attempt_live_everywhere(relayed: list[str]) -> None:
    """`job logs -f` marks its attempt live (its launchers ship each line at once), here
    and, through the relay, in the other processes; a relayed mark wakes the attempt's long
    polls, so a launcher hears it at once; log arrivals name their attempt."""
    assert not notify.logs_live("att-live")
    notify.follow_logs("att-live")
    assert notify.logs_live("att-live")
    notify.follow_logs("att-live")  # marked again only every LIVE_REFRESH
    assert relayed == ["live att-live"]
    before = notify.version("att-there")
    notify.deliver("live att-there", lambda: None, lambda _job: None)
    assert notify.logs_live("att-there") and notify.version("att-there") == before + 1
    assert relayed == ["live att-live"]  # no echo
    notify.logs_arrived("att-live")
    assert relayed[-1] == "logs att-live"
