"""When the reconciler looks at an attempt with nothing marking it (server/agenda.py): its
own timer, at the latest its sweep, at once when its backend says something new about its
launchers; an attempt the database lists and the agenda does not know is looked at now, and
one that ended is forgotten."""

from __future__ import annotations

from typing import Any

from batchyard.server.agenda import LIVENESS_EVERY, SWEEP_EVERY, SWEEP_SPREAD, Agenda, Watched


class Pids:
    """A backend whose launchers live while ``alive`` says so."""

    def __init__(self) -> None:
        self.alive: list[bool | None] = [True, True]
        self.asked = 0

    def alive_of(self, handle: dict[str, Any]) -> list[bool | None]:
        self.asked += 1
        return list(self.alive)


class Backend:
    def __init__(self, pids: Pids) -> None:
        self.pids = pids

    def alive(self, handle: dict[str, Any]) -> list[bool | None]:
        return self.pids.alive_of(handle)


def test_timers_sweeps_and_listing() -> None:
    agenda = Agenda()
    agenda.listed(100.0, [1, 2])
    assert agenda.pick(100.0, set()) == [1, 2]  # unknown: looked at now
    agenda.looked(1, 100.0, 0.5, None)
    agenda.looked(2, 100.0, None, None)
    assert agenda.pick(100.2, set()) == []
    assert agenda.pick(100.2, {2}) == [2]  # marked
    assert agenda.pick(100.6, set()) == [1]  # its timer
    latest = 100.0 + SWEEP_EVERY * (1 + SWEEP_SPREAD)
    assert agenda.pick(latest, set()) == [1, 2]  # the sweep, at the latest
    agenda.looked(1, 100.0, 0.0, None)  # a look that changed it: again at once
    assert agenda.next_in(100.0) == 0.0
    agenda.listed(101.0, [1])  # 2 ended
    assert 2 not in agenda.due
    agenda.forget()
    assert agenda.due == {} and agenda.sweep_due(0.0)


def test_a_launcher_that_dies_is_looked_at_without_the_database() -> None:
    pids = Pids()
    agenda = Agenda()
    agenda.looked(7, 10.0, None, Watched(Backend(pids), {}, [True, True]))
    assert agenda.liveness(10.0) == set()
    assert agenda.liveness(10.0 + LIVENESS_EVERY / 2) == set() and pids.asked == 1
    pids.alive = [True, False]
    assert agenda.liveness(10.0 + LIVENESS_EVERY) == {7}
    assert agenda.next_in(10.0 + LIVENESS_EVERY) <= LIVENESS_EVERY
    agenda.end(7)
    assert agenda.liveness(20.0) == set() and pids.asked == 2
