"""The real reconciler against a real store (``scheduler_sim.py --store N``).

Why: the pure-scheduler figures leave out what a pass costs around the scheduler: reading
the queue from the database, the holds pre-pass, writing pending reasons. With 2,000 queued
jobs that part was 76 % of the server's time (py-spy) while the scheduling itself was 0.9 %.
Here a temp home gets a SQLite (or ``--db``) store, a cluster whose one node stays
``preparing`` for an hour (jobs fit but never start), and N queued jobs inserted straight
through the store; then ``Reconciler.tick()`` runs in-process and its time is taken:

* the first pass (the queue read once, every pending reason written);
* idle passes (nothing changed): CPU per pass and the share of a core at the loop's tick;
* passes after 10 submits each (a steady stream of new jobs).

The baselines in the same run: the same measure with an empty queue, and the pure scheduler
(``schedule()``) inside those very passes (its CPU time, taken by a wrapper): the share of a
real pass the pure figures of ``scheduler_sim.py`` stand for.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _store(db_url: str | None, queued: int) -> tuple[Any, Any]:
    from sqlalchemy import insert

    from batchyard.server.context import ServerContext
    from batchyard.server.reconciler import Reconciler
    from batchyard.server.services import clusters, jobs
    from batchyard.spec.cluster import ClusterSpec
    from batchyard.spec.job import JobSpec
    from batchyard.store.db import Database
    from batchyard.store.models import Job

    db = Database(db_url or f"sqlite:///{os.environ['BATCHYARD_HOME']}/batchyard.db")
    db.migrate()
    ctx = ServerContext(db=db, admin_token="bench")
    with db.session() as s:
        clusters.create(s, "default", ClusterSpec.model_validate({
            "name": "q", "vm_size": "Standard_D2_v2", "manual": {"target_node_count": 1},
            "provisioning_delay": 3600}))
    with db.session() as s:
        jobs.submit(ctx, s, "default", JobSpec.model_validate(
            {"name": "probe", "command": "true"}), cluster="q")
    with db.session() as s:
        template = s.query(Job).filter_by(name="probe").one()
        base = {c: getattr(template, c) for c in (
            "workspace_id", "experiment_id", "cluster_id", "source_format", "priority",
            "directory")}
        spec = dict(template.spec)
    for start in range(0, queued, 5000):
        rows = [{**base, "name": f"big-{i}", "spec": {**spec, "name": f"big-{i}"},
                 "state": "queued", "attempt": 0, "cancel_requested": False,
                 "submitted_at": time.time()} for i in range(start, min(queued, start + 5000))]
        with db.session() as s:
            s.execute(insert(Job), rows)
    return ctx, Reconciler(ctx)


def _cpu() -> float:
    """This process's CPU seconds (ns resolution: os.times() counts 10 ms ticks, longer
    than most passes)."""
    return time.process_time()


def _submit(ctx: Any, count: int, tag: str) -> None:
    from batchyard.server.services import jobs
    from batchyard.spec.job import JobSpec

    for i in range(count):
        with ctx.db.session() as s:
            jobs.submit(ctx, s, "default", JobSpec.model_validate(
                {"name": f"{tag}-{i}", "command": "true"}), cluster="q")


class _Timed:
    """Wraps the reconciler's ``schedule``: CPU seconds spent in the pure scheduler."""

    def __init__(self) -> None:
        import batchyard.server.scheduling as scheduling

        self.module, self.inner, self.spent = scheduling, scheduling.schedule, 0.0

    def __call__(self, snapshot: Any) -> Any:
        c0 = time.thread_time()  # the pass's own thread
        try:
            return self.inner(snapshot)
        finally:
            self.spent += time.thread_time() - c0

    def __enter__(self) -> _Timed:
        self.module.schedule = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.module.schedule = self.inner


def measure(queued: int, db_url: str | None, passes: int = 40) -> dict[str, Any]:
    try:
        from batchyard.server.scheduling import TICK
    except ImportError:  # a tree from before the scheduling pass had its own module
        from batchyard.server.reconciler import TICK  # type: ignore[attr-defined,no-redef]

    home = tempfile.mkdtemp(prefix="batchyard-simstore-")
    os.environ["BATCHYARD_HOME"] = home
    ctx, rec = _store(db_url, queued)
    with _Timed() as timed:
        c0, w0 = _cpu(), time.perf_counter()
        rec.tick()
        first = time.perf_counter() - w0, _cpu() - c0, timed.spent
        idle = []
        for _ in range(passes):
            c0 = _cpu()
            rec.tick()
            idle.append(_cpu() - c0)
            time.sleep(TICK)  # as the loop waits between passes
        busy, pure = [], []
        for n in range(passes // 4):
            _submit(ctx, 10, f"s{n}")
            c0, p0 = _cpu(), timed.spent
            rec.tick()
            busy.append(_cpu() - c0)
            pure.append(timed.spent - p0)
    ctx.db.engine.dispose()
    Path(home, "batchyard.db").unlink(missing_ok=True)
    idle_pass = statistics.mean(idle)
    scheduled = [(b, p) for b, p in zip(busy, pure, strict=True) if p > 0]
    return {"queued": queued, "first_wall": first[0], "first_cpu": first[1],
            "first_pure": first[2],
            "idle_pass_ms": idle_pass * 1000, "idle_core": idle_pass / TICK,
            "busy_pass_ms": statistics.mean(busy) * 1000,
            "busy_pass_ms_mmm": [min(busy) * 1000, statistics.median(busy) * 1000,
                                 max(busy) * 1000],
            "scheduled": f"{len(scheduled)}/{len(busy)}",
            "sched_full_ms": statistics.mean(b for b, _ in scheduled) * 1000 if scheduled
            else float("nan"),
            "sched_pure_ms": statistics.mean(p for _, p in scheduled) * 1000 if scheduled
            else float("nan")}


def report(sizes: list[int], db_url: str | None) -> None:
    print("\nThe real reconciler on a real store (Reconciler.tick() in-process; "
          f"{'PostgreSQL' if db_url else 'SQLite'}; one node that never becomes idle); CPU ms, "
          "and of it the pure schedule() (the pure figures above), full / pure:")
    print(f"{'queued':>8} {'1st pass':>20} {'idle pass':>10} {'idle core':>10} "
          f"{'after 10 submits, min/median/max':>34} {'passes that scheduled':>34} "
          f"{'vs empty':>9}")
    base: dict[str, Any] | None = None
    for size in [0, *sizes]:
        r = measure(size, db_url)
        base = base or r
        ratio = r["busy_pass_ms"] / base["busy_pass_ms"] if base["busy_pass_ms"] else 0.0
        mmm = "/".join(f"{x:.1f}" for x in r["busy_pass_ms_mmm"])
        fp = r["first_cpu"] / r["first_pure"] if r["first_pure"] else float("nan")
        first = f"{r['first_cpu'] * 1000:.0f} ({r['first_pure'] * 1000:.1f}) x{fp:.0f}"
        sp = r["sched_full_ms"] / r["sched_pure_ms"] if r["sched_pure_ms"] else float("nan")
        sched = (f"{r['scheduled']}: {r['sched_full_ms']:.1f} ({r['sched_pure_ms']:.2f}) "
                 f"x{sp:.0f}")
        print(f"{size:>8,} {first:>20} {r['idle_pass_ms']:>10.2f} {r['idle_core']:>10.1%} "
              f"{mmm:>34} {sched:>34} {ratio:>8.2f}x")
