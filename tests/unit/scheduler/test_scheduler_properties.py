"""Property tests over random snapshots: the invariants no pass may ever break."""

from __future__ import annotations

import math
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchyard.scheduler import (
    ClusterView,
    JobView,
    NodeView,
    Plan,
    QuotaView,
    RunningJobView,
    Snapshot,
    schedule,
)

NOW = 10_000.0
LOST = {"leaving", "unusable", "preempted"}
FAMILIES = ("standardNCFamily", "standardDFamily")


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    clusters: dict[int, ClusterView] = {}
    nodes: list[NodeView] = []
    running: list[RunningJobView] = []
    next_node = 1
    next_run = 10_000
    for cid in range(1, draw(st.integers(1, 3)) + 1):
        autoscale = draw(st.booleans())
        min_nodes = draw(st.integers(0, 3))
        clusters[cid] = ClusterView(
            cid,
            f"c{cid}",
            draw(st.integers(1, 2)),
            draw(st.sampled_from(FAMILIES)),
            draw(st.sampled_from([2, 4, 6])),
            draw(st.integers(0, 2)),
            autoscale=autoscale,
            min_nodes=min_nodes,
            max_nodes=draw(st.integers(min_nodes, 12)),
            target_nodes=draw(st.integers(0, 12)),
            idle_seconds_before_scaledown=draw(st.sampled_from([0.0, 600.0, 5000.0])),
        )
        busy: list[int] = []
        for _ in range(draw(st.integers(0, 10))):
            state = draw(
                st.sampled_from(
                    [
                        *("idle", "idle", "idle", "running", "running", "preparing"),
                        *("leaving", "unusable", "preempted"),
                    ]
                )
            )
            idle_since = draw(st.one_of(st.none(), st.floats(0, NOW)))
            job_id = None
            if state == "running" or (state == "idle" and draw(st.integers(0, 5)) == 0):
                job_id = -1  # filled below when the node joins a running job
                busy.append(next_node)
            nodes.append(NodeView(next_node, cid, f"n{next_node}", state, job_id, idle_since))
            next_node += 1
        while busy:
            take = draw(st.integers(1, len(busy)))
            group, busy = busy[:take], busy[take:]
            wall = draw(st.one_of(st.none(), st.floats(1, 20_000)))
            started = draw(st.floats(0, NOW))
            running.append(RunningJobView(next_run, cid, tuple(group), started, wall))
            next_run += 1
    owner = {nid: r.id for r in running for nid in r.node_ids}
    nodes = [
        NodeView(n.id, n.cluster_id, n.name, n.state, owner[n.id], n.idle_since)
        if n.job_id == -1
        else n
        for n in nodes
    ]
    queued = [
        JobView(
            jid,
            draw(st.integers(1, len(clusters) + 1)),  # sometimes a cluster that is gone
            draw(st.integers(1, 2)),
            draw(st.integers(1, 6)),
            1,
            draw(st.integers(0, 2)),
            draw(st.integers(0, 30)),
            wall_clock=draw(st.one_of(st.none(), st.floats(1, 20_000))),
        )
        for jid in range(1, draw(st.integers(0, 25)) + 1)
    ]
    quotas = [
        QuotaView(
            ws,
            fam,
            draw(st.one_of(st.none(), st.integers(0, 60))),
            draw(st.integers(0, 40)),
            draw(st.one_of(st.none(), st.integers(0, 12))),
            draw(st.integers(0, 6)),
        )
        for ws in (1, 2)
        for fam in FAMILIES
        if draw(st.booleans())
    ]
    return Snapshot(NOW, clusters, nodes, queued, running, quotas)


def _key(job: JobView) -> tuple[int, int, int]:
    return (-job.priority, job.seq, job.id)


def _end(job: JobView) -> float:
    return math.inf if job.wall_clock is None else NOW + job.wall_clock


def _outlives(end: float, start: float) -> bool:
    return end > start or end == math.inf


def _check_reservation(snap: Snapshot, plan: Plan, cid: int) -> None:
    """Recompute the head's promise from scratch and check backfill kept it."""
    res = plan.reservations[cid]
    cluster = snap.clusters[cid]
    jobs = {j.id: j for j in snap.queued}
    head = jobs[res.job_id]
    assert head.id in plan.pending
    mine = [p for p in plan.placements if jobs[p.job_id].cluster_id == cid]
    before = [p for p in mine if not p.backfill]
    after = [p for p in mine if p.backfill]
    assert all(_key(jobs[p.job_id]) < _key(head) for p in before)
    assert all(_key(jobs[p.job_id]) > _key(head) for p in after)
    # any job ahead of the head that still waits is one that can never start here
    for job in snap.queued:
        if job.cluster_id == cid and _key(job) < _key(head) and job.id in plan.pending:
            assert "cannot start until" in plan.pending[job.id]
    members = [n for n in snap.nodes if n.cluster_id == cid]
    state = {n.id: n.state for n in members}
    free = sum(n.free for n in members) - sum(len(p.node_ids) for p in before)
    alive = len([n for n in members if n.state not in ("leaving", "preempted")])
    inflight = max(0, cluster.target_nodes - alive)
    grow = max(0, cluster.max_nodes - alive - inflight) if cluster.autoscale else 0
    prov = sum(n.state == "preparing" and n.job_id is None for n in members) + inflight
    ends = [(_end(jobs[p.job_id]), len(p.node_ids)) for p in before]
    for run in snap.running:
        back = sum(state.get(n, "leaving") not in LOST for n in run.node_ids)
        if run.cluster_id == cid and back:
            end = math.inf if run.wall_clock is None else run.started_at + run.wall_clock
            ends.append((max(NOW, end), back))

    def avail(t: float) -> int:
        return free + prov + grow + sum(n for e, n in ends if e <= t and e < math.inf)

    node_start = min([NOW] + [e for e, _ in ends], key=lambda t: (avail(t) < head.nodes, t))
    if avail(node_start) < head.nodes:
        node_start = math.inf
    assert res.start >= node_start
    assert res.extra_nodes == max(0, avail(res.start) - head.nodes)
    if not math.isinf(res.start):
        assert avail(res.start) >= head.nodes
    long_backfill = [p for p in after if _outlives(_end(jobs[p.job_id]), res.start)]
    assert sum(len(p.node_ids) for p in long_backfill) <= res.extra_nodes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_invariants_of_any_pass(snap: Snapshot) -> None:
    plan = schedule(snap)
    jobs = {j.id: j for j in snap.queued}
    nodes = {n.id: n for n in snap.nodes}
    # placements: whole gangs, on free nodes of the job's cluster, each node at most once
    given_nodes: list[int] = []
    for p in plan.placements:
        job = jobs[p.job_id]
        assert len(p.node_ids) == job.nodes
        for nid in p.node_ids:
            assert nodes[nid].free and nodes[nid].cluster_id == job.cluster_id
        given_nodes.extend(p.node_ids)
    assert len(given_nodes) == len(set(given_nodes))
    placed = [p.job_id for p in plan.placements]
    assert len(placed) == len(set(placed))
    # every queued job is either placed or has a reason, never both
    assert set(placed) | set(plan.pending) == set(jobs)
    assert not set(placed) & set(plan.pending)
    assert all(plan.pending.values())
    # quota never exceeded
    for q in snap.quotas:
        vcpus = q.vcpu_used
        gpus = q.gpu_used
        for p in plan.placements:
            job = jobs[p.job_id]
            c = snap.clusters[job.cluster_id]
            if (job.workspace_id, c.family) == (q.workspace_id, q.family):
                vcpus += job.nodes * c.vcpus_per_node
                gpus += job.nodes * c.gpus_per_node
                assert q.vcpu_limit is None or vcpus <= q.vcpu_limit
                assert q.gpu_limit is None or gpus <= q.gpu_limit
    # nobody is overtaken except by backfill that keeps the head's reservation
    for cid in snap.clusters:
        mine = [p for p in plan.placements if jobs[p.job_id].cluster_id == cid]
        if cid in plan.reservations:
            _check_reservation(snap, plan, cid)
        else:
            assert not any(p.backfill for p in mine)
    # autoscale: bounded targets, only stale idle nodes released, never below min
    released = set(plan.release_nodes)
    assert not released & set(given_nodes)
    gone: dict[int, int] = defaultdict(int)
    for nid in released:
        node = nodes[nid]
        c = snap.clusters[node.cluster_id]
        assert c.autoscale and node.free and node.idle_since is not None
        assert NOW - node.idle_since > c.idle_seconds_before_scaledown
        gone[c.id] += 1
    for cid, target in plan.scale_targets.items():
        c = snap.clusters[cid]
        assert c.autoscale and c.min_nodes <= target <= c.max_nodes
        assert target != c.target_nodes
    for cid, count in gone.items():
        alive = [
            n
            for n in snap.nodes
            if n.cluster_id == cid and n.state not in ("leaving", "preempted")
        ]
        assert len(alive) - count >= snap.clusters[cid].min_nodes


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 8),
    specs=st.lists(
        st.tuples(
            st.integers(1, 8),  # gang size
            st.integers(0, 2),  # priority
            st.one_of(st.none(), st.integers(1, 50)),  # wall clock (None: unknown)
            st.floats(0.2, 1.0),  # actual run time as a fraction of the wall clock
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_reservations_never_slip_in_a_simulation(
    size: int, specs: list[tuple[int, int, int | None, float]]
) -> None:
    """With honest wall clocks, a head starts no later than its first finite reservation.

    This is the whole point of EASY: backfill may fill holes, never push the head back.
    """
    cluster = ClusterView(1, "c", 1, "f", 1, 0, target_nodes=size)
    queue = [
        JobView(i, 1, 1, n, 1, prio, i, wall_clock=None if wall is None else float(wall))
        for i, (n, prio, wall, _) in enumerate(specs)
        if n <= size
    ]
    actual = {
        i: (wall if wall is not None else 30) * frac
        for i, (_, _, wall, frac) in enumerate(specs)
    }
    promised: dict[int, float] = {}
    started: dict[int, float] = {}
    runs: dict[int, tuple[RunningJobView, float]] = {}
    now = 0.0
    for _ in range(200):
        if not queue:
            break
        busy = {nid: jid for jid, (r, _) in runs.items() for nid in r.node_ids}
        nodes = [
            NodeView(n, 1, f"n{n}", "running" if n in busy else "idle", busy.get(n))
            for n in range(size)
        ]
        snap = Snapshot(now, {1: cluster}, nodes, queue, [r for r, _ in runs.values()])
        plan = schedule(snap)
        res = plan.reservations.get(1)
        if res is not None and not math.isinf(res.start):
            promised.setdefault(res.job_id, res.start)
        for p in plan.placements:
            job = next(j for j in queue if j.id == p.job_id)
            started[job.id] = now
            run = RunningJobView(job.id, 1, p.node_ids, now, job.wall_clock)
            runs[job.id] = (run, now + actual[job.id])
        queue = [j for j in queue if j.id not in started]
        if not runs:
            break
        now = min(end for _, end in runs.values())
        runs = {jid: v for jid, v in runs.items() if v[1] > now}
    assert not queue, "every job that fits the cluster eventually starts"
    for jid, start in promised.items():
        assert started[jid] <= start + 1e-6
