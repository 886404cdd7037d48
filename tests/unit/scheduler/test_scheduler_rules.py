"""One test per scheduling rule: order, gangs, backfill, quota, reasons."""

from __future__ import annotations

import math
from dataclasses import replace

from scheduler_builders import (
    FAMILY,
    busy_nodes,
    cluster,
    job,
    nodes,
    placed,
    running,
    snap,
)

from batchyard.scheduler import JobView, QuotaView, RunningJobView, schedule


def test_higher_priority_goes_first_even_if_submitted_later() -> None:
    plan = schedule(
        snap(
            [cluster()],
            nodes(1, 2, first_id=1),
            [job(10, 2, priority=1, seq=1), job(11, 2, priority=2, seq=2)],
        )
    )
    assert list(placed(plan)) == [11]
    assert plan.pending[10].startswith("waiting for 2 idle nodes: 0 idle, 2 running")


def test_fifo_within_a_priority() -> None:
    queue = [job(12, 1, seq=3), job(10, 1, seq=1), job(11, 1, seq=2)]
    plan = schedule(snap([cluster()], nodes(1, 2, first_id=1), queue))
    assert list(placed(plan)) == [10, 11]
    assert 12 in plan.pending


def test_gang_is_all_or_nothing_and_blocks_the_queue() -> None:
    pool = nodes(1, 2, first_id=1) + busy_nodes(1, 2, first_id=3, job_id=5)
    run = [running(5, (3, 4), wall=None)]
    plan = schedule(snap([cluster()], pool, [job(10, 3), job(11, 1)], run=run))
    assert plan.placements == []
    # job 11 would fit, but it has no wall clock and the 3-node head needs these nodes
    assert plan.pending[11].startswith("waiting behind job 10 (submitted earlier)")


def test_one_job_per_node_and_nodes_are_distinct() -> None:
    plan = schedule(snap([cluster()], nodes(1, 5, first_id=1), [job(i, 2) for i in range(1, 5)]))
    given = [n for p in plan.placements for n in p.node_ids]
    assert len(given) == len(set(given)) == 4
    assert [len(p.node_ids) for p in plan.placements] == [2, 2]


def test_only_idle_unassigned_nodes_are_used() -> None:
    pool = (
        nodes(1, 1, first_id=1)
        + nodes(1, 1, "idle", first_id=2, job_id=99)
        + nodes(1, 1, "unusable", first_id=3)
        + nodes(1, 1, "preparing", first_id=4)
    )
    plan = schedule(snap([cluster()], pool, [job(10, 1), job(11, 1)]))
    assert placed(plan) == {10: (1,)}
    assert plan.pending[11].startswith(
        "waiting for 1 idle node: 0 idle, 1 provisioning, 2 running, 1 unusable"
    )


# --- EASY backfill -----------------------------------------------------------------------


def _backfill_setup(*later: object) -> tuple[list, list, list]:
    # 4 nodes: 2 idle, 2 running job 5 until t=100. The head needs 4 -> reserved at t=100.
    pool = nodes(1, 2, first_id=1) + busy_nodes(1, 2, first_id=3, job_id=5)
    run = [running(5, (3, 4), started=0.0, wall=100.0)]
    return pool, run, list(later)


def test_backfill_that_ends_before_the_reservation_starts() -> None:
    pool, run, _ = _backfill_setup()
    plan = schedule(
        snap([cluster()], pool, [job(10, 4), job(11, 2, wall=60.0)], now=10.0, run=run)
    )
    assert placed(plan) == {11: (1, 2)}
    assert plan.placements[0].backfill
    assert plan.reservations[1].job_id == 10
    assert plan.reservations[1].start == 100.0
    assert "expected to start in about 90 s" in plan.pending[10]


def test_backfill_refused_when_it_would_delay_the_head() -> None:
    pool, run, _ = _backfill_setup()
    queue = [job(10, 4), job(11, 2, wall=120.0), job(12, 1)]
    plan = schedule(snap([cluster()], pool, queue, now=10.0, run=run))
    assert plan.placements == []
    assert plan.pending[11].endswith("starting it now would delay that job")
    assert "no wall-clock limit" in plan.pending[12]


def test_backfill_onto_extra_nodes_runs_past_the_reservation() -> None:
    # 3 idle + 2 running until t=100; the head needs 4, so at t=100 one node is spare.
    pool = nodes(1, 3, first_id=1) + busy_nodes(1, 2, first_id=4, job_id=5)
    run = [running(5, (4, 5), wall=100.0)]
    queue = [job(10, 4), job(11, 2), job(12, 1), job(13, 1)]
    plan = schedule(snap([cluster()], pool, queue, run=run))
    assert list(placed(plan)) == [12]
    assert plan.reservations[1].extra_nodes == 1
    assert 11 in plan.pending and 13 in plan.pending


def test_unknown_wall_clock_means_the_reservation_is_unknown() -> None:
    pool, _, _ = _backfill_setup()
    run = [running(5, (3, 4), wall=None)]
    queue = [job(10, 4), job(11, 1, wall=3600.0), job(12, 1)]
    plan = schedule(snap([cluster()], pool, queue, run=run))
    assert math.isinf(plan.reservations[1].start)
    assert list(placed(plan)) == [11]  # finite jobs end "before never"
    assert "start time unknown" in plan.pending[10]
    assert "no wall-clock limit" in plan.pending[12]


def test_a_lower_priority_job_never_overtakes_without_backfill_rule() -> None:
    pool, run, _ = _backfill_setup()
    queue = [job(10, 4, priority=2), job(11, 2, priority=0, wall=500.0)]
    plan = schedule(snap([cluster()], pool, queue, run=run))
    assert plan.placements == []
    assert plan.pending[11].startswith("waiting behind job 10 (higher priority)")


def test_a_gang_larger_than_the_cluster_does_not_block_it() -> None:
    plan = schedule(snap([cluster(target=2)], nodes(1, 2, first_id=1), [job(10, 5), job(11, 2)]))
    assert list(placed(plan)) == [11]
    assert "needs 5 nodes but cluster 'gpu' has only 2" in plan.pending[10]
    c = cluster(autoscale=True, max_nodes=4)
    plan = schedule(snap([c], [], [job(10, 5), job(11, 2)]))
    assert "can grow to at most 4" in plan.pending[10]
    assert plan.scale_targets == {1: 2}


# --- quota -------------------------------------------------------------------------------


def test_quota_wait_and_its_reason() -> None:
    quota = QuotaView(3, FAMILY, vcpu_limit=24, vcpu_used=24)
    plan = schedule(snap([cluster()], nodes(1, 4, first_id=1), [job(10, 2)], quotas=[quota]))
    assert plan.placements == []
    assert plan.pending[10].startswith(
        "quota: standardNCFamily 24/24 vCPUs in use in workspace 3 (needs 12 more)"
    )


def test_quota_counts_this_pass_placements() -> None:
    quota = QuotaView(3, FAMILY, vcpu_limit=24, vcpu_used=6)
    plan = schedule(
        snap([cluster()], nodes(1, 6, first_id=1), [job(10, 2), job(11, 2)], quotas=[quota])
    )
    assert list(placed(plan)) == [10]
    assert plan.pending[11].startswith("quota: standardNCFamily 18/24 vCPUs in use")
    assert "(needs 6 more)" in plan.pending[11]


def test_gpu_quota_and_a_job_larger_than_the_quota() -> None:
    quota = QuotaView(3, FAMILY, vcpu_limit=None, vcpu_used=0, gpu_limit=2, gpu_used=1)
    plan = schedule(
        snap([cluster()], nodes(1, 4, first_id=1), [job(10, 3), job(11, 2)], quotas=[quota])
    )
    assert "limited to 2; it cannot start until the quota is raised" in plan.pending[10]
    assert plan.pending[11].startswith("quota: standardNCFamily 1/2 GPUs in use")


def test_backfilled_jobs_respect_quota_too() -> None:
    pool, run, _ = _backfill_setup()
    quota = QuotaView(3, FAMILY, vcpu_limit=24, vcpu_used=18)
    queue = [job(10, 4), job(11, 2, wall=10.0)]
    plan = schedule(snap([cluster()], pool, queue, run=run, quotas=[quota]))
    assert plan.placements == []
    assert plan.pending[11].startswith("quota:")


def test_quota_is_held_for_the_first_waiting_job_across_clusters() -> None:
    # Clusters 1 and 2 share workspace 3's family quota (24 vCPUs, 12 in use until t=100).
    # Job 10 (cluster 1) waits for 3 nodes = 18 vCPUs; job 11 on cluster 2 must not eat them.
    clusters = [cluster(1), cluster(2, name="gpu2")]
    pool = busy_nodes(1, 2, first_id=1, job_id=5) + nodes(1, 1, first_id=3) + nodes(
        2, 2, first_id=10
    )
    run = [RunningJobView(5, 1, (1, 2), 0.0, 100.0)]
    quota = QuotaView(3, FAMILY, vcpu_limit=24, vcpu_used=12)
    queue = [job(10, 3, cid=1), job(11, 2, cid=2), job(12, 1, cid=2, wall=50.0)]
    plan = schedule(snap(clusters, pool, queue, run=run, quotas=[quota]))
    assert list(placed(plan)) == [12]
    assert "held for job 10 (submitted earlier)" in plan.pending[11]


# --- reasons -----------------------------------------------------------------------------


def test_every_queued_job_gets_a_reason_or_a_placement() -> None:
    queue = [job(i, 1 + i % 3, cid=1 + i % 3, priority=i % 3) for i in range(1, 60)]
    clusters = [cluster(1), cluster(2, autoscale=True, max_nodes=3), cluster(3)]
    pool = nodes(1, 4, first_id=1) + nodes(2, 1, "preparing", first_id=20)
    plan = schedule(snap(clusters, pool, [*queue, job(99, cid=42)]))
    ids = {j.id for j in queue} | {99}
    assert set(plan.pending) | set(placed(plan)) == ids
    assert not set(plan.pending) & set(placed(plan))
    assert all(plan.pending.values())
    assert plan.pending[99] == "cluster 42 does not exist"


def test_provisioning_reason_matches_the_portal_wording() -> None:
    c = cluster(autoscale=True, max_nodes=4, target=2)
    plan = schedule(snap([c], nodes(1, 2, "preparing", first_id=1), [job(10, 2)]))
    assert plan.pending[10].startswith(
        "waiting for 2 idle nodes: 0 idle, 2 provisioning — scaling up to 2"
    )
    assert plan.scale_targets == {}


def test_empty_cluster_says_so() -> None:
    plan = schedule(snap([cluster()], [], [job(10, 1)]))
    assert plan.pending[10].startswith("cluster has no nodes: the size of 'gpu' is 0")
    plan = schedule(snap([cluster(autoscale=True, max_nodes=3)], [], [job(10, 2)]))
    assert plan.pending[10].startswith("cluster has no nodes — scaling up to 2")
    assert plan.scale_targets == {1: 2}


def test_a_reason_names_the_jobs_holding_the_nodes_it_waits_for() -> None:
    pool = busy_nodes(1, 1, first_id=1, job_id=5) + busy_nodes(1, 1, first_id=2, job_id=6)
    run = [RunningJobView(5, 1, (1,), 0.0, None, name="train-a"),
           RunningJobView(6, 1, (2,), 0.0, None, name="train-b")]
    plan = schedule(snap([cluster()], pool, [job(10, 2)], run=run))
    assert "held by train-a, train-b" in plan.pending[10], plan.pending[10]


def test_many_holders_are_counted_not_listed() -> None:
    from batchyard.scheduler.reasons import held_by

    assert held_by(["a", "b", "c", "d", "e"]) == "held by a, b, c and 2 more"


# --- other jobs by name (issue 33, item 13) ----------------------------------------------


def _named(job_id: int, nodes_: int, name: str, experiment: str, **kw: object) -> JobView:
    base = job(job_id, nodes_, **kw)  # type: ignore[arg-type]
    return replace(base, name=name, experiment=experiment)


def test_a_reason_names_the_job_it_waits_behind_and_its_experiment() -> None:
    """'waiting behind job 160' sent users to `job show -n 160`, which says not found."""
    pool = nodes(1, 2, first_id=1) + busy_nodes(1, 2, first_id=3, job_id=5)
    run = [running(5, (3, 4), wall=None)]
    queue = [_named(160, 3, "big-train", "mnist"), _named(161, 1, "small", "mnist")]
    plan = schedule(snap([cluster()], pool, queue, run=run))
    assert plan.pending[161].startswith(
        "waiting behind job big-train in experiment mnist (submitted earlier)")
    assert "160" not in plan.pending[161]


def test_quota_reasons_name_the_holder_and_the_workspace() -> None:
    clusters = [cluster(1), cluster(2, name="gpu2")]
    pool = busy_nodes(1, 2, first_id=1, job_id=5) + nodes(1, 1, first_id=3) + nodes(
        2, 2, first_id=10
    )
    run = [RunningJobView(5, 1, (1, 2), 0.0, 100.0)]
    quota = QuotaView(3, FAMILY, vcpu_limit=24, vcpu_used=12, workspace="team-a")
    queue = [_named(10, 3, "large", "exp-a", cid=1), _named(11, 2, "other", "exp-b", cid=2)]
    plan = schedule(snap(clusters, pool, queue, run=run, quotas=[quota]))
    assert ("vCPUs in workspace team-a are held for job large in experiment exp-a "
            "(submitted earlier)") in plan.pending[11], plan.pending[11]
