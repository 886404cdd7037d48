"""``server.balance``: when a process of a ``--workers`` server closes a keep-alive
connection, on a real shared memfd."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from batchyard.server import balance
from batchyard.server.balance import Balance, ShedConnections, make_shared


@pytest.fixture
def shared() -> Any:
    fd = make_shared(3)
    yield fd
    os.close(fd)


def test_a_process_two_above_the_least_loaded_sheds_one_at_a_time(
        shared: int, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(balance.time, "monotonic", lambda: now[0])
    mine, other, third = Balance(shared, 0, 3), Balance(shared, 1, 3), Balance(shared, 2, 3)
    mine.publish(9)
    other.publish(8)
    third.publish(8)
    assert mine.counts() == (9, 8, 8)
    assert not mine.over_share()  # one above: as even as it gets
    third.publish(7)
    assert mine.over_share()
    assert not mine.over_share()  # the next waits for SHED_GAP (its count to update)
    now[0] += balance.SHED_GAP
    assert mine.over_share()
    assert not other.over_share() and not third.over_share()


def test_a_shedding_answer_says_connection_close_and_others_do_not(shared: int) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"connection", b"keep-alive"), (b"x-a", b"1")]})
        await send({"type": "http.response.body", "body": b"ok"})

    busy = Balance(shared, 0, 3)
    busy.publish(5)

    def answer() -> list[Any]:
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        asyncio.run(ShedConnections(app, busy)({"type": "http"}, None, send))
        return sent

    first = answer()
    assert first[0]["headers"] == [(b"x-a", b"1"), (b"connection", b"close")]
    assert first[1]["body"] == b"ok"
    second = answer()  # within SHED_GAP: untouched
    assert second[0]["headers"] == [(b"connection", b"keep-alive"), (b"x-a", b"1")]
