"""A long poll waiting in ``notify.wait_change`` sleeps until its key is bumped (from any
thread, or by another server process through ``deliver``), or its time is up. It used to
look every 5 ms: a thousand agents' heartbeats waiting at once were 200,000 wake-ups a
second of the server's one event loop (bench/fleet_sim.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from batchyard.server import notify


class CountingLoop(asyncio.SelectorEventLoop):
    """Counts the loop's iterations: each is a wake-up of the server's event loop."""

    iterations = 0

    def _run_once(self) -> None:
        CountingLoop.iterations += 1
        super()._run_once()  # type: ignore[misc]


def run(coro: Any) -> Any:
    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        return runner.run(coro)


def test_waiting_polls_sleep_until_their_time_is_up() -> None:
    async def main() -> list[bool]:
        seen = [notify.version(f"quiet-{i}") for i in range(10)]
        CountingLoop.iterations = 0
        return list(await asyncio.gather(*(notify.wait_change(f"quiet-{i}", seen[i], 1.0)
                                           for i in range(10))))

    assert run(main()) == [False] * 10
    # polling every 5 ms made at least 200 iterations in this second; sleeping makes a few
    # (a few per poll at most, when a busy machine spreads their time-outs apart)
    assert CountingLoop.iterations < 60, CountingLoop.iterations


def test_a_bump_from_a_worker_thread_wakes_the_poll_at_once() -> None:
    async def main() -> tuple[bool, float]:
        seen = notify.version("attempt-w")
        threading.Timer(0.1, notify.bump, args=("attempt-w",)).start()
        t0 = time.monotonic()
        moved = await notify.wait_change("attempt-w", seen, 30.0)
        return moved, time.monotonic() - t0

    moved, took = run(main())
    assert moved and took < 20.0


def test_a_change_before_the_wait_answers_at_once() -> None:
    async def main() -> bool:
        seen = notify.version("attempt-x")
        notify.bump("attempt-x")
        return await notify.wait_change("attempt-x", seen, 30.0)

    assert run(main()) is True


def test_a_gap_in_hearing_other_processes_wakes_every_poll() -> None:
    async def main() -> list[bool]:
        keys = ["node:71", "attempt-y"]
        seen = [notify.version(k) for k in keys]
        waits = [asyncio.ensure_future(notify.wait_change(k, v, 30.0))
                 for k, v in zip(keys, seen, strict=True)]
        await asyncio.sleep(0.05)
        notify.deliver("bump *", lambda: None, lambda _job: None)
        return list(await asyncio.wait_for(asyncio.gather(*waits), 20.0))

    assert run(main()) == [True, True]
    assert not notify._waiters  # nothing left behind
