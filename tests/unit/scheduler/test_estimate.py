"""The start-time estimate walk (scheduler.estimate): conservative backfill on a timeline of
free nodes, in the scheduler's order, and what-if options."""

from __future__ import annotations

import math

from scheduler_builders import busy_nodes, cluster, job, nodes, running, snap

from batchyard.scheduler import schedule
from batchyard.scheduler.estimate import Timeline, estimates, what_if

NOW = 1000.0


def two_busy(walls: tuple[float | None, float | None] = (600.0, 1800.0)):
    """Cluster 1 with 2 nodes, each running a job that started at NOW."""
    ns = busy_nodes(1, 1, first_id=1, job_id=91) + busy_nodes(1, 1, first_id=2, job_id=92)
    run = [running(91, [1], started=NOW, wall=walls[0]),
           running(92, [2], started=NOW, wall=walls[1])]
    return ns, run


def test_queue_walked_in_order_with_backfill_into_holes() -> None:
    ns, run = two_busy()
    queue = [job(1, 2, wall=3600), job(2, 1, wall=1300), job(3, 1, wall=300)]
    got = estimates(snap([cluster(target=2)], ns, queue, now=NOW, run=run))
    assert got[1].start == NOW + 1800  # both nodes back
    assert got[1].ahead == 0
    # job 2 (1300 s) does not fit in the 600..1800 hole of node 1: after job 1
    assert got[2].start == NOW + 1800 + 3600
    # job 3 (5 min) fits in that hole: it cannot delay job 1
    assert got[3].start == NOW + 600
    assert got[3].ahead == 2


def test_priority_goes_first_and_no_wall_clock_is_unknown() -> None:
    ns, run = two_busy((600.0, None))
    queue = [job(1, 2, wall=60), job(2, 1, wall=60, priority=2)]
    got = estimates(snap([cluster(target=2)], ns, queue, now=NOW, run=run))
    assert got[2].start == NOW + 600
    assert got[1].start == math.inf  # node 2's job has no wall clock
    assert "wall-clock" in got[1].note


def test_overrunning_job_counts_as_ending_now_and_never_fits_is_said() -> None:
    ns, run = two_busy((10.0, 20.0))
    queue = [job(1, 2, wall=60), job(2, 3, wall=60)]
    got = estimates(snap([cluster(target=2)], ns, queue, now=NOW + 100, run=run))
    assert got[1].start == NOW + 100
    assert got[2].start == math.inf
    assert "at most 2" in got[2].note


def test_first_job_matches_the_schedulers_reservation() -> None:
    ns, run = two_busy()
    queue = [job(1, 2, wall=3600), job(2, 1, wall=300)]
    s = snap([cluster(target=2)], ns, queue, now=NOW, run=run)
    plan = schedule(s)
    assert estimates(s)[1].start == plan.reservations[1].start


def test_what_if_offers_fewer_nodes_and_another_cluster() -> None:
    ns, run = two_busy()
    other = cluster(2, name="cpu", target=1)
    s = snap([cluster(target=2), other], ns + nodes(2, 1, first_id=10),
             [job(1, 1, wall=600)], now=NOW, run=run)
    options = what_if(s, job(0, 2, wall=900), [2])
    asked = options[0]
    assert (asked.cluster_id, asked.nodes) == (1, 2)
    # job 1 takes node 1 at 600 until 1200; both free at 1800
    assert asked.start == NOW + 1800
    assert asked.ahead == 1
    fewer = [o for o in options if o.cluster_id == 1 and o.nodes == 1]
    assert fewer and fewer[0].start == NOW + 1200
    elsewhere = [o for o in options if o.cluster_id == 2]
    assert elsewhere and elsewhere[0].start == math.inf  # cpu has 1 node: 2 never fit
    ok = what_if(s, job(0, 1, wall=900), [2])
    assert [o.start for o in ok if o.cluster_id == 2] == [NOW]


def test_timeline_books_and_skips_full_prefix() -> None:
    line = Timeline(0.0, 0, [(10.0, 1), (20.0, 1)], 2)
    assert line.earliest(1, 5) == 10.0
    line.book(10.0, 5, 1)
    assert line.earliest(1, 5) == 15.0
    assert line.earliest(2, math.inf) == 20.0
    line.book(20.0, math.inf, 2)
    assert line.earliest(1, 1) == 15.0
    assert line.earliest(1, 6) == math.inf


def test_ten_thousand_queued_walk_fast() -> None:
    """Not a timing test: the walk stays linear (a quadratic one would take minutes)."""
    ns, run = two_busy()
    queue = [job(i, 1 + i % 2, wall=60 + i % 7) for i in range(1, 10_001)]
    got = estimates(snap([cluster(target=2)], ns, queue, now=NOW, run=run))
    assert len(got) == 10_000
    starts = [got[i].start for i in range(1, 10_001)]
    assert all(s < math.inf for s in starts)


def _naive_earliest(bookings: list[tuple[float, float, int]], free0: list[tuple[float, int]],
                    nodes: int, duration: float, now: float) -> float:
    """Every candidate start checked against every booking: slow and obviously right."""
    def free_at(t: float) -> int:
        base = sum(c for at, c in free0 if at <= t)
        return base - sum(n for s, e, n in bookings if s <= t < e)

    points = sorted({now, *(at for at, _ in free0), *(e for _, e, _ in bookings)})
    points = [p for p in points if p >= now and p < math.inf]
    for start in points:
        end = start + duration
        inside = [p for p in points if start <= p < end]
        if all(free_at(p) >= nodes for p in inside):
            return start
    return math.inf


def test_timeline_agrees_with_a_naive_walk() -> None:
    import random

    rng = random.Random(35)
    for _ in range(60):
        cap = rng.randint(1, 5)
        ends = [(float(rng.choice([0, 10, 20, 35, 50])), 1) for _ in range(cap)]
        line = Timeline(0.0, 0, ends, cap)
        free0 = [(e, c) for e, c in ends]
        bookings: list[tuple[float, float, int]] = []
        for _ in range(25):
            nodes_ = rng.randint(1, cap)
            duration = float(rng.choice([3, 7, 12, 30]))
            want = _naive_earliest(bookings, free0, nodes_, duration, 0.0)
            got = line.earliest(nodes_, duration)
            assert got == want
            if got < math.inf:
                line.book(got, duration, nodes_)
                bookings.append((got, got + duration, nodes_))


def test_fair_share_orders_the_walk_as_the_scheduler_does() -> None:
    from dataclasses import replace

    from batchyard.scheduler import AccountView, FairShareView

    ns = busy_nodes(1, 1, first_id=1, job_id=91)
    run = [running(91, [1], started=NOW, wall=100.0)]
    heavy, light = replace(job(1, 1, wall=50), account=1), replace(job(2, 1, wall=50), account=2)
    fs = FairShareView({1: AccountView(1, "vision", "ann", usage=1e6),
                        2: AccountView(2, "nlp", "bob", usage=0.0)},
                       {"vision": 1.0, "nlp": 1.0})
    s = replace(snap([cluster(target=1)], ns, [heavy, light], now=NOW, run=run), fairshare=fs)
    got = estimates(s)
    assert got[2].start == NOW + 100 and got[1].start == NOW + 150
    assert schedule(replace(s, nodes=nodes(1, 1, first_id=1), running=[])).placements[0] \
        .job_id == 2  # the scheduler agrees on who goes first
    held = replace(s, held_teams={"nlp": "budget spent"})
    assert 2 not in estimates(held) and estimates(held)[1].start == NOW + 100
