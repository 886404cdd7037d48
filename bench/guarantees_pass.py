"""What teams' guaranteed capacity (issue 35 §2) costs one scheduling pass.

Why: the guard runs inside the pass (every placement on a cluster with guarantees asks it),
and reclaim after it. This times ``schedule()`` on the same snapshot without guarantees (the
anchor) and with every cluster's capacity guaranteed to teams (half of it, split among 10
teams per cluster), plus ``reclaim()`` over the jobs the pass left waiting, and prints the
ratios. Rounds alternate; medians.

Usage: python bench/guarantees_pass.py [--nodes 10000] [--queued 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace

from batchyard.scheduler import ClusterView, JobView, NodeView, RunningJobView, Snapshot, schedule
from batchyard.scheduler.guarantees import reclaim
from batchyard.scheduler.model import Guarantee, GuaranteeView

TEAMS = 50
PER_CLUSTER = 100  # nodes


def snapshot(nodes: int, queued: int, seed: int) -> tuple[Snapshot, GuaranteeView]:
    rng = random.Random(seed)
    count = max(1, nodes // PER_CLUSTER)
    clusters = {c: ClusterView(c, f"c{c}", 1, "standardNCFamily", 24, 4, target_nodes=PER_CLUSTER)
                for c in range(1, count + 1)}
    node_views: list[NodeView] = []
    running: list[RunningJobView] = []
    nid = 0
    jid = 10_000_000
    for c in clusters:
        busy = int(PER_CLUSTER * 0.9)
        for start in range(0, busy, 2):  # 2-node jobs of random teams hold 90 %
            jid += 1
            ids = (nid + start, nid + start + 1)
            running.append(RunningJobView(jid, c, ids, 0.0, 3600.0,
                                          account=rng.randint(1, TEAMS * 10)))
            for i in ids:
                node_views.append(NodeView(i, c, f"n{i}", "running", jid))
        for i in range(nid + busy, nid + PER_CLUSTER):
            node_views.append(NodeView(i, c, f"n{i}", "idle"))
        nid += PER_CLUSTER
    jobs = [JobView(j, rng.randint(1, count), 1, rng.choice((1, 1, 2, 4)), 1,
                    rng.choice((0, 1, 1, 2)), j, rng.choice((None, 600.0, 3600.0)),
                    account=rng.randint(1, TEAMS * 10)) for j in range(1, queued + 1)]
    base = Snapshot(10.0, clusters, node_views, jobs, running)
    per_team = PER_CLUSTER // 2 // 10
    guarantees = {c: {f"t{(c + k) % TEAMS}": Guarantee(per_team, per_team) for k in range(10)}
                  for c in clusters}
    team_of = {a: f"t{a % TEAMS}" for a in range(1, TEAMS * 10 + 1)}
    return base, GuaranteeView(guarantees, team_of)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base, view = snapshot(args.nodes, args.queued, 7)
    guarded = replace(base, guarantees=view)
    plain_s, guard_s, reclaim_s = [], [], []
    for _ in range(args.rounds):
        started = time.perf_counter()
        schedule(base)
        plain_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        plan = schedule(guarded)
        guard_s.append(time.perf_counter() - started)
        placed = {p.job_id for p in plan.placements}
        waiting = [j for j in base.queued if j.id not in placed]
        started = time.perf_counter()
        victims = reclaim(view, base.running, waiting, {}, set(), base.now)
        reclaim_s.append(time.perf_counter() - started)
    plain, guard, back = (statistics.median(x) for x in (plain_s, guard_s, reclaim_s))
    print(f"{args.nodes} nodes, {args.queued} queued, {len(base.running)} running, "
          f"{len(view.clusters)} clusters with 10 guaranteed teams each")
    print(f"pass without guarantees (anchor): {plain * 1000:8.1f} ms")
    print(f"pass with guarantees:             {guard * 1000:8.1f} ms  ({guard / plain:.2f}x)")
    print(f"reclaim after it:                 {back * 1000:8.1f} ms  ({back / plain:.2f}x), "
          f"{len(victims)} victims, {len(plan.borrowed)} borrowed placements")


if __name__ == "__main__":
    main()
