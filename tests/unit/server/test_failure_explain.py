"""The server's choice of an ended attempt's cause: the error a node saw first wins (not the
first report to arrive), a lost node and a preemption are named by the server, and the
message is one line carrying the cause."""

from __future__ import annotations

from typing import Any

from batchyard.backends.base import GangStatus, NodeStatus
from batchyard.node import failure
from batchyard.server.failures import explain
from batchyard.store.models import Attempt

NAMES = ["n-0", "n-1"]


def _attempt(reason: str | None = None, abort: bool = False) -> Attempt:
    return Attempt(cancel_reason=reason, control={"abort": {"node_rank": 0}} if abort else {})


def _node(rank: int, state: str, error: dict[str, Any] | None = None,
          message: str | None = None) -> NodeStatus:
    return NodeStatus(node_rank=rank, state=state, message=message,
                      raw={"error": error} if error else {})


def test_the_error_seen_first_wins_over_a_later_collateral_one() -> None:
    root = failure.record(failure.USER, node="n-1", node_rank=1, rank=3, exit_code=1,
                          lines=["Traceback (most recent call last):", "ValueError: boom"],
                          at=100.0)
    collateral = failure.record(failure.USER, node="n-0", node_rank=0, rank=0, exit_code=1,
                                lines=["RuntimeError: Connection closed by peer"], at=100.4)
    status = GangStatus([
        _node(0, "failed", collateral, "rank 0 on node n-0 exited with code 1 (user code "
              "error): RuntimeError: Connection closed by peer"),
        _node(1, "failed", root, "rank 3 on node n-1 exited with code 1 (user code error): "
              "ValueError: boom")])
    error, message = explain(_attempt(abort=True), status, NAMES, "failed",
                             "rank 0 on node n-0 exited with code 1")
    assert error is root
    assert message == "rank 3 on node n-1 exited with code 1 (user code error): ValueError: boom"


def test_a_lost_node_is_named() -> None:
    status = GangStatus([_node(0, "aborted"), _node(1, "lost")])
    error, message = explain(_attempt("lost"), status, NAMES, "failed",
                             "node launcher on n-1 died")
    assert error is not None and (error["cause"], error["node"]) == ("node lost", "n-1")
    assert message == "node launcher on n-1 died (node lost)"


def test_a_preemption_is_the_attempts_cause_and_success_has_none() -> None:
    status = GangStatus([_node(0, "preempted")])
    error, message = explain(_attempt("preempted"), status, NAMES, "requeue",
                             "node n-0 was preempted")
    assert error is not None and (error["cause"], error["node"]) == ("preempted", "n-0")
    assert message == "node n-0 was preempted (preempted)"
    assert explain(_attempt(), GangStatus([_node(0, "succeeded")]), NAMES, "succeeded",
                   None) == (None, None)


def test_a_wall_clock_stop_keeps_its_words() -> None:
    stop = "exceeded max wall clock time of 3s"
    error = failure.record(failure.WALL_CLOCK, node="n-0", node_rank=0, summary=stop,
                           what="node")
    got, message = explain(_attempt(abort=True), GangStatus([_node(0, "timeout", error, stop)]),
                           NAMES, "failed", stop)
    assert got is error and message == f"{stop} (wall clock)"


def test_an_mpi_rank_named_by_the_reconciler_keeps_its_own_error() -> None:
    mpirun = failure.record(failure.USER, node="n-0", node_rank=0, rank=0, exit_code=134,
                            lines=["Primary job terminated normally"], at=50.0)
    rank3 = failure.record("signal 6", node="n-1", node_rank=1, rank=3, exit_code=134, at=50.2)
    status = GangStatus([_node(0, "failed", mpirun, "mpirun on node n-0 exited with code 134"),
                         _node(1, "failed", rank3, "MPI rank 3 on node n-1 exited with code "
                               "134 (signal 6): killed by SIGABRT")])
    error, message = explain(_attempt(abort=True), status, NAMES, "failed",
                             "MPI rank 3 on node n-1 exited with code 134")
    assert error is rank3
    assert message == "MPI rank 3 on node n-1 exited with code 134 (signal 6): killed by SIGABRT"


def test_slurms_time_limit_is_the_wall_clock_not_a_lost_node() -> None:
    ended = "Slurm's time limit (--time) was reached: Slurm job 7 ended TIMEOUT"
    attempt = _attempt("lost")
    attempt.handle = {"queue_ended": ended}
    error, message = explain(attempt, GangStatus([_node(0, "aborted")]), NAMES, "failed", ended)
    assert error is not None and error["cause"] == "wall clock"
    assert message == f"{ended} (wall clock)"


def test_slurms_node_failure_wins_over_the_ranks_it_took_down() -> None:
    ended = "node n-1 (not responding) failed: Slurm job 7 ended NODE_FAIL"
    attempt = _attempt("lost", abort=True)
    attempt.handle = {"queue_ended": ended}
    collateral = failure.record("signal 15", node="n-0", node_rank=0, rank=0, exit_code=143)
    status = GangStatus([_node(0, "failed", collateral, "rank 0 on node n-0 exited with code "
                               "143 (signal 15): killed by SIGTERM"), _node(1, "aborted")])
    error, message = explain(attempt, status, NAMES, "failed", ended)
    assert error is not None and (error["cause"], error["node"]) == ("node lost", "n-1")
    assert message == f"{ended} (node lost)"


def test_a_hang_verdict_wins_over_the_ranks_its_teardown_took_down() -> None:
    collateral = failure.record(failure.USER, node="n-1", node_rank=1, rank=2, exit_code=1,
                                lines=["ConnectionResetError: [Errno 104] Connection reset "
                                       "by peer"], at=100.0)
    status = GangStatus([_node(0, "aborted"), _node(1, "failed", collateral, "rank 2 on node "
                                                    "n-1 exited with code 1")])
    verdict = "hung: no rank progressed for 5s: rank 3 in take_twice (hang.py:32)"
    error, message = explain(_attempt(failure.HUNG, abort=True), status, NAMES, "failed",
                             verdict)
    assert error is not None and error["cause"] == failure.HUNG
    assert message == verdict


GLOO_RESET = ["Traceback (most recent call last):", "    work.wait()",
              "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
              "[127.0.0.1]:3998. This is typically caused by a remote worker crashing."]


def test_a_dead_launcher_wins_over_its_peers_broken_connection_heard_first() -> None:
    """Issue 16 item 3: node 1's launcher is killed, its ranks die with it, rank 0 on node 0
    fails on the broken connection, and a busy server hears that report before it sees the
    launcher gone (the abort is node 0's, no stop was sent): the dead node is the cause."""
    collateral = failure.record(failure.USER, node="n-0", node_rank=0, rank=0, exit_code=1,
                                lines=GLOO_RESET, at=100.4)
    status = GangStatus([_node(0, "failed", collateral, "rank 0 on node n-0 exited with code "
                               "1 (user code error): RuntimeError: Connection closed by peer"),
                         _node(1, "lost", message="node launcher died")])
    error, message = explain(_attempt(abort=True), status, NAMES, "failed",
                             "rank 0 on node n-0 exited with code 1 (user code error): "
                             "RuntimeError: Connection closed by peer")
    assert error is not None and (error["cause"], error["node"]) == ("node lost", "n-1")
    assert message == "node launcher on n-1 died (node lost)"


def test_a_dead_launcher_seen_first_wins_over_a_later_rank_failure() -> None:
    """The server saw the launcher gone and sent the stop (at 100.0) before rank 0 failed
    (at 100.3, its own exception even): the record made first wins; a rank SIGTERMed by
    the stop (exit 143) is never the cause either."""
    for later in (failure.record(failure.USER, node="n-0", node_rank=0, rank=0, exit_code=1,
                                 lines=["ValueError: late"], at=100.3),
                  failure.record("signal 15", node="n-0", node_rank=0, rank=0, exit_code=143,
                                 at=99.0)):
        attempt = _attempt("lost", abort=True)
        attempt.control = {**(attempt.control or {}), "cancel": {"state": "aborted", "at": 100.0,
                                                                 "message": "node launcher "
                                                                 "on n-1 died"}}
        attempt.message = "node launcher on n-1 died"
        status = GangStatus([_node(0, "failed", later, "rank 0 on node n-0 exited with code "
                                   f"{later['exit_code']}"), _node(1, "lost")])
        error, message = explain(attempt, status, NAMES, "failed",
                                 f"rank 0 on node n-0 exited with code {later['exit_code']}")
        assert error is not None and (error["cause"], error["node"]) == ("node lost", "n-1")
        assert message == "node launcher on n-1 died (node lost)"


def test_a_rank_that_failed_first_on_its_own_stays_the_cause_when_a_launcher_dies_later(
        ) -> None:
    """The other order: rank 0's own exception (before any stop), then node 1's launcher
    died in the teardown: the exception is the cause."""
    root = failure.record(failure.USER, node="n-0", node_rank=0, rank=0, exit_code=1,
                          lines=["Traceback (most recent call last):", "ValueError: boom"],
                          at=100.0)
    attempt = _attempt("lost", abort=True)
    attempt.control = {**(attempt.control or {}), "cancel": {"state": "aborted", "at": 100.5}}
    attempt.message = "node launcher on n-1 died"
    status = GangStatus([_node(0, "failed", root, "rank 0 on node n-0 exited with code 1"),
                         _node(1, "lost")])
    error, message = explain(attempt, status, NAMES, "failed",
                             "rank 0 on node n-0 exited with code 1")
    assert error is root
    assert message == "rank 0 on node n-0 exited with code 1 (user code error): ValueError: boom"
