"""The sweep driver: a loop in the server that, for every running sweep, reads the trials'
objective metric, stops poor trials by the early-termination policy, samples and submits new
trials while the limits allow, and ends the sweep when nothing is left to run.

Everything it knows is in the store, and every trial is made in one transaction with its
job (the trial index is unique per sweep): a server killed at any moment loses no trial and
runs none twice; the restarted one carries on from the rows. Sampling is deterministic per
trial index (``sweeps.sampling``), so a trial whose transaction was lost is drawn again the
same way (random, grid) or from the same history (bayesian).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import BatchyardError
from batchyard.server import storage_trouble
from batchyard.server.context import ServerContext
from batchyard.server.services import common, jobs
from batchyard.server.services.sweeps import stop_job, trial_job_name
from batchyard.spec.durations import format_duration
from batchyard.spec.job import JobSpec
from batchyard.states import JOB_ACTIVE
from batchyard.storage.secrets import unseal_spec
from batchyard.store.db import begin_write
from batchyard.store.models import (
    Cluster,
    Experiment,
    Job,
    Metric,
    Sweep,
    SweepTrial,
    Workspace,
    now,
)
from batchyard.sweeps import policies, substitute
from batchyard.sweeps import space as sp
from batchyard.sweeps.sampling import Past, next_draw

log = logging.getLogger("batchyard.sweeps")
PERIOD = 0.5


def metric_series(session: Session, job_ids: list[int], metric: str
                  ) -> dict[int, dict[int, float]]:
    """Per job, ``{step: value}`` of one metric: the values of its lowest rank (the one
    that logs, in a DDP script), a value without a step counted as step 1, 2, ..."""
    if not job_ids:
        return {}
    rows = session.execute(select(Metric.job_id, Metric.step, Metric.value, Metric.rank)
                           .where(Metric.job_id.in_(job_ids), Metric.name == metric,
                                  Metric.value.is_not(None))
                           .order_by(Metric.id)).tuples().all()
    lowest: dict[int, int] = {}
    for job_id, _, _, rank in rows:
        r = -1 if rank is None else rank
        lowest[job_id] = min(r, lowest.get(job_id, r))
    out: dict[int, dict[int, float]] = {}
    for job_id, step, value, rank in rows:
        if (-1 if rank is None else rank) != lowest[job_id] or value is None:
            continue
        series = out.setdefault(job_id, {})
        series[int(step) if step is not None else len(series) + 1] = float(value)
    return out


class SweepDriver:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.ctx.leader is not None and not self.ctx.leader.held():
                stop.wait(PERIOD)  # the leading server drives the sweeps
                continue
            try:
                self.tick()
            except Exception as exc:
                storage_trouble.log_once(log, "sweep driver pass failed; retrying", exc)
            stop.wait(PERIOD)

    def tick(self) -> None:
        with self.ctx.db.session() as session:
            running = list(session.scalars(select(Sweep.id).where(Sweep.state == "running")))
        for sweep_id in running:  # each on its own: one sweep's trouble never stops the rest
            try:
                self.drive(sweep_id)
            except Exception as exc:
                storage_trouble.log_once(log, f"driving sweep {sweep_id} failed", exc)

    def drive(self, sweep_id: int) -> None:
        with self.ctx.db.session() as session:
            wanted = self._follow(session, sweep_id)
        made = 0
        for index in wanted:
            if not self._make_trial(sweep_id, index):
                break
            made += 1
        if made:
            self.ctx.kick()
        with self.ctx.db.session() as session:
            self._maybe_finish(session, sweep_id)

    # --- following trials ---------------------------------------------------------------

    def _follow(self, session: Session, sweep_id: int) -> list[int]:
        """Objectives and early termination; returns the indices of trials to make now."""
        sweep = session.get(Sweep, sweep_id)
        if sweep is None or sweep.state != "running":
            return []
        spec = sweep.spec
        rows = _trials(session, sweep)
        goal = str(spec["objective"]["goal"])
        series = metric_series(session, [j.id for _, j in rows if j is not None],
                               str(spec["objective"]["primary_metric"]))
        by_trial = {t.index: series.get(j.id, {}) for t, j in rows if j is not None}
        for trial, _job in rows:
            values = by_trial.get(trial.index) or {}
            last = values[max(values)] if values else None
            if last is not None and trial.objective != last:
                trial.objective = last if math.isfinite(last) else None
        policy = spec.get("early_termination")
        if policy and policy.get("type") != "none":
            for trial, job in rows:
                if job is not None and job.state == "running" and not job.cancel_requested:
                    self._judge(session, trial, job, policy, by_trial, goal)
        timeout = spec["limits"].get("timeout")
        if timeout and now() - sweep.created_at > float(timeout) and not sweep.cancel_requested:
            reason = f"stopped: the sweep's timeout of {format_duration(float(timeout))} passed"
            sweep.cancel_requested = True
            sweep.message = f"timeout of {format_duration(float(timeout))} reached"
            common.record(session, "sweep", sweep.id, "running", "running", sweep.message)
            session.flush()  # takes the write lock: the jobs read again below stay true
            for _, job in rows:
                if job is not None:
                    session.refresh(job)
                    stop_job(session, job, reason)
            return []
        if sweep.cancel_requested:
            return []
        limits = spec["limits"]
        total = int(limits["max_total_trials"])
        concurrent = int(limits.get("max_concurrent_trials") or total)
        active = sum(1 for _, j in rows if j is not None and j.state in JOB_ACTIVE)
        made = max((t.index for t, _ in rows), default=-1) + 1
        room = min(concurrent - active, total - made)
        return list(range(made, made + max(0, room)))

    @staticmethod
    def _judge(session: Session, trial: SweepTrial, job: Job, policy: dict[str, Any],
               by_trial: dict[int, dict[int, float]], goal: str) -> None:
        values = by_trial.get(trial.index) or {}
        done = trial.evaluated_step if trial.evaluated_step is not None else -math.inf
        for step in sorted(s for s in values if s > done):
            if policies.is_evaluation_step(policy, step) and policies.should_stop(
                    policy, trial.index, by_trial, step, goal):
                reason = policies.stop_reason(policy, step)
                trial.stopped_by = reason
                stop_job(session, job, reason)
                break
        if values:
            trial.evaluated_step = max(values)

    # --- making trials ------------------------------------------------------------------

    def _make_trial(self, sweep_id: int, index: int) -> bool:
        """Trial ``index`` and its job, in one transaction. False: no more can be made."""
        try:
            with self.ctx.db.session() as session:
                begin_write(session)
                sweep = session.get(Sweep, sweep_id)
                if sweep is None or sweep.state != "running" or sweep.cancel_requested:
                    return False
                if session.scalar(select(SweepTrial.id).where(
                        SweepTrial.sweep_id == sweep_id, SweepTrial.index == index)):
                    return True  # made already (by a pass of a server now gone)
                return self._submit_trial(session, sweep, index)
        except BatchyardError as exc:
            with self.ctx.db.session() as session:
                sweep = session.get(Sweep, sweep_id)
                if sweep is not None and sweep.state == "running":
                    message = f"cannot make trial {index}: {exc.message}"
                    log.warning("sweep %s: %s", sweep.name, message)
                    self._end(session, sweep, "failed", message)
            return False

    def _submit_trial(self, session: Session, sweep: Sweep, index: int) -> bool:
        spec = sweep.spec
        history = [Past(t.raw, t.objective, failed=j is None or (
            j.state in ("failed", "canceled") and t.objective is None))
            for t, j in _trials(session, sweep)]
        space = spec["search_space"]
        sampling = spec["sampling"]
        draw = next_draw(sampling["type"], space, index, history,
                         goal=spec["objective"]["goal"], seed=sampling.get("seed"))
        if draw is None:
            return False
        params = sp.values_of(space, draw)
        trial = substitute.apply(unseal_spec(spec["trial"], sweep.sealed), params)
        trial["env"] = {**(trial.get("env") or {}), "BATCHYARD_SWEEP": sweep.name,
                        "BATCHYARD_TRIAL_INDEX": str(index)}
        trial["tags"] = {**(trial.get("tags") or {}), "batchyard.sweep": sweep.name,
                         "batchyard.trial": str(index),
                         "hyperparameters": json.dumps(params)}
        ws = session.get(Workspace, sweep.workspace_id)
        exp = session.get(Experiment, sweep.experiment_id)
        c = session.get(Cluster, sweep.cluster_id)
        assert ws is not None and exp is not None and c is not None
        result = jobs.submit(self.ctx, session, ws.name, JobSpec.model_validate(trial),
                             experiment=exp.name, cluster=c.name,
                             name=trial_job_name(sweep.name, index),
                             source_format=sweep.source_format, created_by=sweep.created_by)
        session.add(SweepTrial(sweep_id=sweep.id, index=index, job_id=int(result["id"]),
                               params=params, raw=draw, created_at=now()))
        session.flush()
        common.record(session, "sweep", sweep.id, "running", "running",
                      f"trial {index}: {json.dumps(params)}")
        return True

    # --- ending ---------------------------------------------------------------------------

    def _maybe_finish(self, session: Session, sweep_id: int) -> None:
        sweep = session.get(Sweep, sweep_id)
        if sweep is None or sweep.state != "running":
            return
        rows = _trials(session, sweep)
        if any(j is not None and j.state in JOB_ACTIVE for _, j in rows):
            return
        total = int(sweep.spec["limits"]["max_total_trials"])
        if not sweep.cancel_requested and len(rows) < total:
            return  # more to make (next pass)
        scored = [t for t, _ in rows if t.objective is not None]
        if sweep.cancel_requested and not sweep.message:
            self._end(session, sweep, "canceled", "canceled by user")
        elif not scored:
            self._end(session, sweep, "failed", sweep.message or
                      f"no trial of {len(rows)} logged "
                      f"{sweep.spec['objective']['primary_metric']}")
        else:
            from batchyard.server.services.sweeps import best, trials

            top = best(session, sweep, trials(session, sweep))
            assert top is not None
            metric = sweep.spec["objective"]["primary_metric"]
            text = (f"{len(rows)} trials; best {top['name']} with {metric} "
                    f"{top['objective']:g}")
            self._end(session, sweep, "succeeded",
                      f"{sweep.message}: {text}" if sweep.message else text)

    @staticmethod
    def _end(session: Session, sweep: Sweep, state: str, message: str) -> None:
        common.record(session, "sweep", sweep.id, sweep.state, state, message)
        sweep.state = state
        sweep.message = message
        sweep.ended_at = now()


def _trials(session: Session, sweep: Sweep) -> list[tuple[SweepTrial, Job | None]]:
    return list(session.execute(
        select(SweepTrial, Job).outerjoin(Job, Job.id == SweepTrial.job_id)
        .where(SweepTrial.sweep_id == sweep.id).order_by(SweepTrial.index)).tuples().all())
