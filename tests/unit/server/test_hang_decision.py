"""When the server takes a gang for hung (services/hangs.py): every node of a running
attempt says its own ranks are idle; a node whose ranks all ended well does not hold it up."""

from __future__ import annotations

from batchyard.backends.base import GangStatus, NodeStatus
from batchyard.server.services.hangs import gang_idle
from batchyard.store.models import Attempt


def gang(*nodes: tuple[str, bool]) -> GangStatus:
    return GangStatus([NodeStatus(r, state, raw={"idle": idle})
                       for r, (state, idle) in enumerate(nodes)])


def test_every_node_must_be_idle() -> None:
    running = Attempt(state="running")
    assert gang_idle(running, gang(("running", True), ("running", True)))
    assert not gang_idle(running, gang(("running", True), ("running", False)))
    assert not gang_idle(running, gang(("running", True), ("preparing", True)))
    assert not gang_idle(running, GangStatus([NodeStatus(0, "running")]))  # no word yet


def test_a_finished_node_does_not_hide_a_hang_elsewhere() -> None:
    running = Attempt(state="running")
    assert gang_idle(running, gang(("succeeded", False), ("running", True)))
    assert not gang_idle(running, gang(("succeeded", False), ("succeeded", False)))
    assert not gang_idle(running, gang(("failed", False), ("running", True)))


def test_only_a_running_attempt_hangs() -> None:
    both = gang(("running", True), ("running", True))
    assert not gang_idle(Attempt(state="stopping"), both)
    assert not gang_idle(Attempt(state="preparing"), both)
