"""Wake-ups between server processes over a real PostgreSQL's LISTEN/NOTIFY (server/bus.py):
what one process publishes reaches the others once per burst, never comes back to itself,
survives payloads past PostgreSQL's limit, and a listener whose connection was cut comes
back and wakes everything (it may have missed some)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from batchyard.server.bus import Bus
from yardkit import wait_until


@pytest.fixture()
def engine(postgres_database: Callable[[], str]) -> Iterator[Engine]:
    made = create_engine(postgres_database())
    yield made
    made.dispose()


def _pair(engine: Engine) -> tuple[Bus, list[str], Bus, list[str]]:
    heard_a: list[str] = []
    heard_b: list[str] = []
    a, b = Bus(engine, heard_a.append), Bus(engine, heard_b.append)
    for bus in (a, b):
        bus.start()
        assert bus.listening.wait(30)
    return a, heard_a, b, heard_b


def test_a_burst_reaches_the_others_once_and_never_its_sender(engine: Engine) -> None:
    a, heard_a, b, heard_b = _pair(engine)
    try:
        for _ in range(200):
            a.publish("kick")
        a.publish("bump 5f0c")
        a.publish("dirty 17")
        wait_until(lambda: "dirty 17" in heard_b, 20, what="b to hear a")
        assert "bump 5f0c" in heard_b
        assert 1 <= heard_b.count("kick") < 200  # coalesced while the first was in flight
        b.publish("logs")
        wait_until(lambda: "logs" in heard_a, 20, what="a to hear b")
        assert "kick" not in heard_a and "logs" not in heard_b  # nobody hears itself
    finally:
        a.stop()
        b.stop()


def test_messages_past_the_payload_limit_all_arrive(engine: Engine) -> None:
    a, _, b, heard_b = _pair(engine)
    try:
        wanted = [f"bump attempt-{i:05d}-{'x' * 60}" for i in range(600)]  # ~45 KB
        for message in wanted:
            a.publish(message)
        wait_until(lambda: set(wanted) <= set(heard_b), 30, what="every message")
    finally:
        a.stop()
        b.stop()


def test_a_cut_listener_comes_back_and_wakes_everything(engine: Engine) -> None:
    a, _, b, heard_b = _pair(engine)
    try:
        with engine.connect() as conn:
            cut = conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'batchyard-bus' AND query LIKE 'LISTEN%'")).all()
            conn.commit()
        assert len(cut) == 2
        wait_until(lambda: "bump *" in heard_b, 30, what="b to listen again")
        assert "kick" in heard_b and "logs" in heard_b
        wait_until(lambda: b.listening.is_set(), 30)
        a.publish("dirty 99")
        wait_until(lambda: "dirty 99" in heard_b, 30, what="b to hear a after the cut")
    finally:
        a.stop()
        b.stop()
