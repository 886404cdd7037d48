"""Autoscale: grow for the waiting gangs up to the maximum, shrink idle nodes down to min."""

from __future__ import annotations

from scheduler_builders import busy_nodes, cluster, job, nodes, placed, running, snap

from batchyard.scheduler import schedule


def test_scale_up_to_fit_the_waiting_gangs_in_order() -> None:
    c = cluster(autoscale=True, max_nodes=10, target=1)
    plan = schedule(snap([c], nodes(1, 1, first_id=1), [job(10, 3), job(11, 2)]))
    assert plan.placements == []
    assert plan.scale_targets == {1: 5}  # 1 idle + 2 more for job 10, 2 more for job 11
    assert plan.pending[10].startswith("waiting for 3 idle nodes: 1 idle — scaling up to 5")


def test_scale_up_is_capped_at_max_nodes() -> None:
    c = cluster(autoscale=True, max_nodes=4, target=2)
    pool = busy_nodes(1, 2, first_id=1, job_id=5)
    run = [running(5, (1, 2), wall=None)]
    plan = schedule(snap([c], pool, [job(10, 4), job(11, 1)], run=run))
    assert plan.scale_targets == {1: 4}
    c = cluster(autoscale=True, max_nodes=4)
    plan = schedule(snap([c], [], [job(10, 3), job(11, 3)]))
    assert plan.scale_targets == {1: 3}  # job 11 cannot fit next to job 10: no half step


def test_no_scale_target_when_it_is_already_the_target() -> None:
    c = cluster(autoscale=True, max_nodes=4, target=2)
    plan = schedule(snap([c], nodes(1, 2, "preparing", first_id=1), [job(10, 2)]))
    assert plan.scale_targets == {}


def test_min_nodes_is_kept_with_an_empty_queue() -> None:
    c = cluster(autoscale=True, min_nodes=2, max_nodes=4, target=0)
    plan = schedule(snap([c], [], []))
    assert plan.scale_targets == {1: 2}


def test_scale_down_after_the_idle_timeout_oldest_first_never_below_min() -> None:
    c = cluster(autoscale=True, min_nodes=1, max_nodes=4, target=4, idle_timeout=600)
    pool = [
        *nodes(1, 1, first_id=1, idle_since=0.0),
        *nodes(1, 1, first_id=2, idle_since=100.0),
        *nodes(1, 1, first_id=3, idle_since=200.0),
        *nodes(1, 1, first_id=4, idle_since=950.0),  # idle only 50 s at t=1000
    ]
    plan = schedule(snap([c], pool, [], now=1000.0))
    assert plan.release_nodes == [1, 2, 3]
    assert plan.scale_targets == {1: 1}
    c = cluster(autoscale=True, min_nodes=3, max_nodes=4, target=4, idle_timeout=600)
    plan = schedule(snap([c], pool, [], now=1000.0))
    assert plan.release_nodes == [1]
    assert plan.scale_targets == {1: 3}


def test_no_scale_down_before_the_timeout() -> None:
    c = cluster(autoscale=True, max_nodes=4, target=2, idle_timeout=600)
    plan = schedule(snap([c], nodes(1, 2, first_id=1, idle_since=500.0), [], now=1000.0))
    assert plan.release_nodes == []
    assert plan.scale_targets == {}


def test_idle_nodes_needed_by_a_waiting_gang_are_kept() -> None:
    c = cluster(autoscale=True, max_nodes=4, target=4, idle_timeout=60)
    pool = nodes(1, 3, first_id=1, idle_since=0.0) + busy_nodes(1, 1, first_id=4, job_id=5)
    run = [running(5, (4,), wall=None)]
    plan = schedule(snap([c], pool, [job(10, 4)], now=1000.0, run=run))
    assert plan.release_nodes == []
    assert "the cluster is at its maximum of 4" in plan.pending[10]


def test_recently_used_nodes_are_placed_first_so_old_idle_ones_can_go() -> None:
    c = cluster(autoscale=True, max_nodes=4, target=3, idle_timeout=600)
    pool = [
        *nodes(1, 1, first_id=1, idle_since=0.0),
        *nodes(1, 1, first_id=2, idle_since=900.0),
        *nodes(1, 1, first_id=3, idle_since=990.0),
    ]
    plan = schedule(snap([c], pool, [job(10, 1)], now=1000.0))
    assert placed(plan) == {10: (3,)}
    assert plan.release_nodes == [1]
    assert plan.scale_targets == {1: 2}


def test_no_longer_needed_scale_up_is_cancelled() -> None:
    c = cluster(autoscale=True, max_nodes=4, target=4)
    plan = schedule(snap([c], [], []))
    assert plan.scale_targets == {1: 0}


def test_manual_clusters_never_get_scale_decisions() -> None:
    c = cluster(target=2, idle_timeout=1)
    plan = schedule(snap([c], nodes(1, 2, first_id=1, idle_since=0.0), [], now=1000.0))
    assert plan.scale_targets == {}
    assert plan.release_nodes == []
