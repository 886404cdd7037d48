"""Long queues: the shortcuts for saturated clusters give the same decisions, and stay fast."""

from __future__ import annotations

import random
import time

from scheduler_builders import FAMILY, busy_nodes, cluster, job, nodes, placed, running, snap

from batchyard.scheduler import JobView, NodeView, QuotaView, schedule


def test_deep_queue_jobs_wait_behind_the_head_with_its_start_time() -> None:
    pool = nodes(1, 2, first_id=1) + busy_nodes(1, 2, first_id=3, job_id=5)
    run = [running(5, (3, 4), wall=600.0)]
    deep = [job(i, 1 + i % 3) for i in range(3, 500)]
    queue = [job(1, 2, wall=60.0), job(2, 4, priority=2), *deep]
    plan = schedule(snap([cluster()], pool, queue, run=run))
    assert placed(plan) == {1: (1, 2)}  # ends at t=60, before job 2's reservation at t=600
    assert plan.reservations[1].job_id == 2
    for i in range(3, 500):
        assert plan.pending[i] == (
            "waiting behind job 2 (higher priority), which is expected to start in about 10 min"
        )


def test_quota_exhausted_cluster_gives_the_quota_reason_to_the_whole_queue() -> None:
    quota = QuotaView(3, FAMILY, vcpu_limit=12, vcpu_used=12)
    other = QuotaView(4, FAMILY, vcpu_limit=None, vcpu_used=0)
    queue = [job(i, 1 + i % 2) for i in range(1, 300)] + [job(900, 1, workspace_id=4)]
    plan = schedule(snap([cluster()], nodes(1, 4, first_id=1), queue, quotas=[quota, other]))
    assert list(placed(plan)) == [900]  # another workspace's quota is not exhausted
    for i in range(2, 300):
        assert plan.pending[i].startswith("quota: standardNCFamily 12/12 vCPUs in use")
        assert plan.pending[i].endswith(f"(needs {6 * (1 + i % 2)} more)")


def test_shared_quota_goes_to_the_higher_priority_job_of_another_cluster() -> None:
    clusters = [cluster(1), cluster(2, name="gpu2")]
    pool = nodes(1, 2, first_id=1) + nodes(2, 2, first_id=10)
    quota = QuotaView(3, FAMILY, vcpu_limit=12, vcpu_used=0)
    queue = [job(1, 2, cid=1, priority=1), job(2, 2, cid=2, priority=2)]
    plan = schedule(snap(clusters, pool, queue, quotas=[quota]))
    assert list(placed(plan)) == [2]
    assert plan.pending[1].startswith("quota: standardNCFamily 12/12 vCPUs in use")


def _big(total: int, queued: int, seed: int) -> tuple[list, list, list[JobView]]:
    rng = random.Random(seed)
    clusters = [cluster(c, name=f"c{c}", target=total // 4) for c in range(1, 5)]
    pool = [
        NodeView(i, 1 + i % 4, f"n{i}", "idle" if rng.random() < 0.3 else "running",
                 None, 0.0)
        for i in range(total)
    ]
    pool = [n if n.state == "idle" else NodeView(n.id, n.cluster_id, n.name, "running", -1)
            for n in pool]
    sizes = (1, 2, 4, 8, 16, 32, 64)
    queue = [
        JobView(j, rng.randint(1, 4), 3, rng.choice(sizes), 1, rng.randint(0, 2), j,
                rng.choice((None, 600.0, 7200.0)))
        for j in range(queued)
    ]
    return clusters, pool, queue


def test_a_large_pass_is_fast_and_complete() -> None:
    clusters, pool, queue = _big(10_000, 100_000, seed=1)
    snapshot = snap(clusters, pool, queue)
    started = time.process_time()
    plan = schedule(snapshot)
    elapsed = time.process_time() - started
    assert len(plan.pending) + len(plan.placements) == len(queue)
    # a bound that catches a pass gone quadratic (minutes), not a slower machine: the pass's
    # own time (~1-2 s here) is measured by bench/scheduler_sim.py
    assert elapsed < 60.0, f"a 10k-node, 100k-job pass took {elapsed:.2f} s of CPU"
