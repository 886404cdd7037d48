"""Dependencies and array throttles, as the scheduler's pure pre-pass decides them."""

from __future__ import annotations

from batchyard.scheduler.holds import DepView, HoldView, evaluate


def test_waiting_jobs_name_what_they_wait_for() -> None:
    queued = [HoldView(2, (DepView(1, "a", "succeeded"),)),
              HoldView(3, (DepView(2, "b", "finished"), DepView(1, "a", "succeeded")))]
    out = evaluate(queued, {1: "running", 2: "queued"}, {})
    assert out.runnable == [] and not out.failed
    assert out.pending[2] == "waiting for job a to succeed (it is running)"
    assert out.pending[3] == "waiting for job b to finish (it is queued); and 1 more dependency"


def test_met_dependencies_release_the_job() -> None:
    queued = [HoldView(2, (DepView(1, "a", "succeeded"),)),
              HoldView(3, (DepView(1, "a", "finished"),)),
              HoldView(4, (DepView(5, "c", "failed"),))]
    out = evaluate(queued, {1: "succeeded", 5: "canceled"}, {})
    assert sorted(out.runnable) == [2, 3, 4] and not out.pending and not out.failed


def test_a_failure_fails_the_chain_transitively_with_reasons() -> None:
    queued = [HoldView(3, (DepView(2, "b", "succeeded"),)),  # listed before b on purpose
              HoldView(2, (DepView(1, "a", "succeeded"),)),
              HoldView(4, (DepView(1, "a", "failed"),)),
              HoldView(5, (DepView(9, "gone", "finished"),))]
    out = evaluate(queued, {1: "failed", 2: "queued", 3: "queued"}, {})
    assert out.failed[2] == ("dependency never satisfied: job a ended failed, and this job "
                             "needed it to succeed")
    assert out.failed[3].startswith("dependency never satisfied: job b ended failed")
    assert out.failed[5] == ("dependency never satisfied: job gone was deleted, and this job "
                             "needed it to finish")
    assert out.runnable == [4]
    succeeded = evaluate([HoldView(4, (DepView(1, "a", "failed"),))], {1: "succeeded"}, {})
    assert 4 in succeeded.failed


def test_array_throttle_lets_the_lowest_indices_through() -> None:
    jobs = [HoldView(10 + i, array=(1, "sim"), array_index=i, array_limit=4)
            for i in (5, 3, 1, 0, 2, 4)]
    out = evaluate(jobs, {}, {(1, "sim"): 1})
    assert sorted(out.runnable) == [10, 11, 12]  # 3 free slots: indices 0, 1, 2
    assert out.pending[15] == "array sim: at most 4 of its jobs run at once (1 running now)"
    full = evaluate(jobs, {}, {(1, "sim"): 4})
    assert full.runnable == [] and len(full.pending) == 6
    free = evaluate([HoldView(1), HoldView(2, array=(1, "x"), array_limit=None)], {}, {})
    assert free.runnable == [1, 2]
