"""The fair walk's fast paths (remembered verdicts, cached reasons of left runs, the queue cut
in one pass) give the same plan as the straightforward walk, where every job takes the full
steps, on random snapshots: small ones from hypothesis (ties in submit order, two
workspaces, quotas, gone clusters) and bench-like ones where quota and nodes run out."""

from __future__ import annotations

import gc
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scheduler_properties import snapshots

from batchyard.scheduler import (
    AccountView,
    ClusterView,
    FairShareView,
    JobView,
    NodeView,
    Plan,
    QuotaView,
    RunningJobView,
    Snapshot,
    schedule,
)
from batchyard.scheduler.core import _Pass
from batchyard.scheduler.fairwalk import FairWalk
from batchyard.scheduler.runs import QueueRuns

TEAMS = ("vision", "nlp", "speech", "")


def _straight(snapshot: Snapshot) -> Plan:
    p = _Pass(snapshot)
    FairWalk(p, snapshot, fast=False).walk(snapshot.held_teams)
    return p.finish()


def _same(snapshot: Snapshot) -> None:
    fast, straight = schedule(snapshot), _straight(snapshot)
    assert fast.placements == straight.placements
    assert fast.pending == straight.pending
    assert fast.reservations == straight.reservations
    assert fast.scale_targets == straight.scale_targets
    assert fast.release_nodes == straight.release_nodes


@st.composite
def fair_snapshots(draw: st.DrawFn) -> Snapshot:
    snap = draw(snapshots())
    people = draw(st.integers(2, 6))
    accounts = {
        a: AccountView(a, draw(st.sampled_from(TEAMS)), f"u{a}",
                       shares=draw(st.sampled_from([0.0, 1.0, 2.0])),
                       usage=draw(st.floats(0, 1e5)), gpu_hours=draw(st.floats(0, 30)))
        for a in range(1, people + 1)
    }
    teams = {t: float(draw(st.integers(0, 3))) for t in TEAMS if draw(st.booleans())}
    queued = [replace(j, account=draw(st.integers(0, people + 1))) for j in snap.queued]
    running = [replace(r, account=draw(st.integers(0, people))) for r in snap.running]
    held = {"nlp": "budget nlp-month is used up"} if draw(st.integers(0, 4)) == 0 else {}
    return replace(snap, queued=queued, running=running, held_teams=held,
                   fairshare=FairShareView(accounts, teams,
                                           charge=draw(st.sampled_from([0.0, 3600.0]))))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fair_snapshots())
def test_fast_walk_gives_the_straightforward_plan(snap: Snapshot) -> None:
    _same(snap)
    assert gc.isenabled()  # schedule() pauses the collector for the pass only


def _big(seed: int) -> Snapshot:
    """A bench-like snapshot: most nodes busy, quota close to full, a long queue of many
    people, so that clusters block (quota promised to a head due later) and saturate."""
    rng = random.Random(seed)
    now = 100_000.0
    shapes = [("nc24", "standardNCFamily", 24, 4, False), ("d16", "standardDFamily", 16, 0, False),
              ("nc6", "standardNCFamily", 6, 1, True)]
    clusters: dict[int, ClusterView] = {}
    nodes: list[NodeView] = []
    running: list[RunningJobView] = []
    used: dict[str, int] = {}
    people = 40
    for cid, (name, family, vcpus, gpus, autoscale) in enumerate(shapes, start=1):
        size = rng.randint(40, 120)
        clusters[cid] = ClusterView(cid, name, 1, family, vcpus, gpus, autoscale=autoscale,
                                    max_nodes=size + (40 if autoscale else 0), target_nodes=size)
        ids = list(range(len(nodes) + 1, len(nodes) + size + 1))
        busy = ids[: int(size * rng.uniform(0.3, 1.0))]
        for nid in ids:
            nodes.append(NodeView(nid, cid, f"{name}-{nid}", "idle", None,
                                  rng.uniform(0, now)))
        while busy:
            take = rng.choice((1, 2, 4, 8))
            gang, busy = busy[:take], busy[take:]
            rid = -(len(running) + 1)
            ran = rng.uniform(0, 9000)  # some end within minutes: quota comes back soon
            wall = rng.choice([None, ran + rng.uniform(30, 20_000), ran + rng.uniform(30, 900)])
            running.append(RunningJobView(rid, cid, tuple(gang), now - ran, wall,
                                          account=rng.randint(1, people)))
            for nid in gang:
                nodes[nid - 1] = replace(nodes[nid - 1], state="running", job_id=rid,
                                         idle_since=None)
            used[family] = used.get(family, 0) + len(gang) * vcpus
    # a few nodes' worth of quota left: heads wait for quota that comes back later, while
    # idle nodes keep their clusters from saturating
    quotas = [QuotaView(1, fam, v + rng.randint(1, 3) * 24, v) for fam, v in used.items()]
    quotas.append(QuotaView(2, "standardNCFamily", rng.randint(0, 200), 0))
    accounts = {a: AccountView(a, f"team{a % 7}", f"u{a}", float(rng.randint(1, 2)),
                               usage=rng.uniform(0, 5e5), gpu_hours=rng.uniform(0, 100))
                for a in range(1, people + 1)}
    teams = {f"team{t}": float(rng.randint(1, 4)) for t in range(7)}
    queued = [
        JobView(j, rng.choice(list(clusters)), rng.choice((1, 1, 1, 2)),
                rng.choice((1, 1, 1, 2, 2, 4, 8, 16, 64)),
                1, rng.choices((0, 1, 2), (2, 7, 1))[0], j,
                wall_clock=rng.choice([None, rng.uniform(100, 3000), rng.uniform(3000, 40_000)]),
                account=rng.randint(1, people))
        for j in range(1, 3001)
    ]
    return Snapshot(now, clusters, nodes, queued, running, quotas,
                    fairshare=FairShareView(accounts, teams))


@pytest.mark.parametrize("seed", range(12))
def test_fast_walk_gives_the_straightforward_plan_on_long_queues(seed: int) -> None:
    snap = _big(seed)
    _same(snap)
    # and with the queue handed over out of submit order (the sorted fallback)
    _same(replace(snap, queued=list(reversed(snap.queued))))


def _plans_equal(a: Plan, b: Plan) -> None:
    assert a.placements == b.placements
    assert a.pending == b.pending
    assert a.reservations == b.reservations
    assert a.scale_targets == b.scale_targets


@pytest.mark.parametrize("seed", range(6))
def test_runs_kept_between_passes_give_the_plan_of_the_queue_cut_afresh(seed: int) -> None:
    """Snapshot.runs kept as jobs leave (placed, cancelled) and enter (new, and requeued
    ones with their old submit order) gives, pass after pass, the plan of the same queue cut
    by the walk itself; a copy that lost count is not used."""
    rng = random.Random(seed)
    snap = _big(seed)
    queue = {j.id: j for j in snap.queued}
    runs = QueueRuns(rng.sample(snap.queued, len(snap.queued)))
    next_id = max(queue) + 1
    placed_any = False
    for _ in range(4):
        queued = sorted(queue.values(), key=lambda j: j.seq)
        kept = replace(snap, queued=queued, runs=runs)
        plan = schedule(kept)
        _plans_equal(plan, schedule(replace(snap, queued=queued)))
        _same(kept)
        placed_any = placed_any or bool(plan.placements)
        leaving = [p.job_id for p in plan.placements] + rng.sample(sorted(queue), 20)
        for job_id in dict.fromkeys(leaving):
            assert runs.discard(queue.pop(job_id))
        for i in range(30):
            old = i % 3 == 0  # a requeued job keeps its place in submit order
            seq = rng.randint(1, next_id) if old else next_id
            job = JobView(next_id, rng.choice(list(snap.clusters)), 1, rng.choice((1, 2, 4)),
                          1, rng.choice((0, 1, 2)), seq, wall_clock=rng.uniform(100, 3000),
                          account=rng.randint(1, 40))
            queue[job.id] = job
            runs.add(job)
            next_id += 1
        assert len(runs) == len(queue)
    assert placed_any
    stale = QueueRuns(list(queue.values())[1:])  # one job short: the walk cuts the queue
    queued = sorted(queue.values(), key=lambda j: j.seq)
    _plans_equal(schedule(replace(snap, queued=queued, runs=stale)),
                 schedule(replace(snap, queued=queued)))


def test_runs_following_the_queue_as_the_server_hands_it_give_the_same_plans() -> None:
    """The server hands its queue as a list each pass (``QueueRuns.follow``): views that
    left, entered or were made again (a changed row: a new object, maybe in another run)
    are told apart by identity, and the plan is that of the queue cut afresh."""
    rng = random.Random(5)
    snap = _big(3)
    runs = QueueRuns()
    queue = list(snap.queued)
    for step in range(4):
        runs.follow(queue)
        assert len(runs) == len(queue)
        kept = replace(snap, queued=queue, runs=runs)
        _plans_equal(schedule(kept), schedule(replace(snap, queued=queue)))
        _same(kept)
        placed = {p.job_id for p in schedule(kept).placements}
        queue = [j for j in queue if j.id not in placed and rng.random() > 0.02]
        for i in rng.sample(range(len(queue)), 15):  # changed rows: new views
            queue[i] = replace(queue[i], priority=rng.choice((0, 1, 2)),
                               account=rng.randint(1, 40))
        queue += [replace(rng.choice(snap.queued), id=10_000 + step * 100 + k,
                          seq=10_000 + step * 100 + k) for k in range(25)]
