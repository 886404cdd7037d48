"""Sweeps: create (validate the trial against its cluster, store the spec), list, show (with
the trials sorted by objective), cancel. Making trials, judging them and ending the sweep
is the driver's (``server.sweep_driver``)."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from batchyard.errors import Conflict, NotFound
from batchyard.server import queue_mirror
from batchyard.server.context import ServerContext, kick_after_commit
from batchyard.server.services import common, jobs, pathcheck, storage
from batchyard.spec.sweep import SweepSpec
from batchyard.states import ATTEMPT_ACTIVE, JOB_ACTIVE, JOB_TERMINAL
from batchyard.storage.secrets import seal_spec
from batchyard.store.db import begin_write
from batchyard.store.models import Attempt, Cluster, Experiment, Job, Sweep, SweepTrial, now
from batchyard.suggest import did_you_mean

SWEEP_ACTIVE = ("running",)


def trial_job_name(sweep: str, index: int) -> str:
    return f"{sweep}_{index}"


def create(ctx: ServerContext, session: Session, workspace: str, spec: SweepSpec, *,
           experiment: str | None = None, cluster: str | None = None, name: str | None = None,
           source_format: str = "native", created_by: str | None = None) -> dict[str, Any]:
    """A sweep; its trials are submitted as ``created_by`` (the sweep's maker)."""
    import uuid

    ws = common.workspace(session, workspace)
    exp_name = experiment or spec.experiment or spec.trial.experiment or common.DEFAULT
    sweep_name = name or spec.name or f"sweep-{uuid.uuid4().hex[:8]}"
    common.check_name("sweep", sweep_name)
    if len(trial_job_name(sweep_name, 9999)) > 64:
        from batchyard.errors import SpecError

        raise SpecError(f"name: sweep name {sweep_name!r} is too long (at most 56 characters: "
                        "its trials are named NAME_<index>)")
    c = jobs._cluster_for(session, ws, spec.trial, cluster or spec.cluster)
    jobs.check_fits(spec.trial, c)
    sha = jobs._code(ctx, spec.trial, session, ws.name)
    trial = spec.trial.model_dump(mode="json", exclude_none=True)
    pathcheck.check_spec(session, ws.name, trial, ctx.tls_files)
    if sha:
        trial["code"] = f"snapshot:{sha}"
    trial.pop("name", None)
    trial["cluster"] = c.name
    trial["experiment"] = exp_name
    storage.check(session, ws.id, trial)
    trial, sealed = seal_spec(trial)
    stored = spec.model_dump(mode="json", exclude_none=True)
    stored.update(trial=trial, name=sweep_name, experiment=exp_name, cluster=c.name)
    begin_write(session)
    exp = jobs._experiment(session, ws, exp_name)
    if session.scalar(select(Sweep.id).where(Sweep.experiment_id == exp.id,
                                             Sweep.name == sweep_name)):
        raise Conflict(f"sweep {sweep_name!r} already exists in experiment {exp_name!r}")
    sweep = Sweep(workspace_id=ws.id, experiment_id=exp.id, cluster_id=c.id, name=sweep_name,
                  spec=stored, sealed=sealed or None, source_format=source_format,
                  state="running", created_at=now(), created_by=created_by)
    try:
        with session.begin_nested():
            session.add(sweep)
            session.flush()
    except IntegrityError:
        raise Conflict(f"sweep {sweep_name!r} already exists in experiment "
                       f"{exp_name!r}") from None
    common.record(session, "sweep", sweep.id, None, "running",
                  f"created on cluster {c.name}")
    kick_after_commit(session)
    return sweep_dict(session, sweep)


def find(session: Session, workspace: str, experiment: str, name: str) -> Sweep:
    ws = common.workspace(session, workspace)
    exp = common.experiment(session, ws, experiment)
    found = session.scalar(select(Sweep).where(Sweep.experiment_id == exp.id,
                                               Sweep.name == name))
    if found is None:
        names = common.known(session, select(Sweep.name).where(Sweep.experiment_id == exp.id))
        raise NotFound(f"sweep {name!r} not found in experiment {experiment!r}"
                       + did_you_mean(name, names))
    return found


def _sort_key(goal: str) -> Any:
    """Trials by objective, best first; those without one last, by index."""
    def key(t: dict[str, Any]) -> tuple[int, float, int]:
        value = t.get("objective")
        if value is None or not math.isfinite(value):
            return (1, 0.0, t["index"])
        return (0, -value if goal == "maximize" else value, t["index"])

    return key


def trials(session: Session, sweep: Sweep) -> list[dict[str, Any]]:
    """Every trial with its job's state, sorted by objective (best first)."""
    rows = session.execute(
        select(SweepTrial, Job).outerjoin(Job, Job.id == SweepTrial.job_id)
        .where(SweepTrial.sweep_id == sweep.id).order_by(SweepTrial.index)).tuples().all()
    out = []
    for trial, job in rows:
        out.append({
            "index": trial.index, "name": job.name if job else None,
            "state": job.state if job else "deleted", "params": trial.params,
            "objective": trial.objective, "stopped_by": trial.stopped_by,
            "message": (job.pending_reason if job.state == "queued" else job.message)
            if job else None,
            "started_at": job.started_at if job else None,
            "ended_at": job.ended_at if job else None,
            "created_at": trial.created_at,
        })
    out.sort(key=_sort_key(str(sweep.spec["objective"]["goal"])))
    return out


def best(session: Session, sweep: Sweep, rows: list[dict[str, Any]] | None = None
         ) -> dict[str, Any] | None:
    """The best trial by objective: among those that succeeded, else any with a value."""
    rows = trials(session, sweep) if rows is None else rows
    scored = [t for t in rows if t["objective"] is not None and math.isfinite(t["objective"])]
    done = [t for t in scored if t["state"] == "succeeded"]
    chosen = done or scored
    return chosen[0] if chosen else None


def sweep_dict(session: Session, sweep: Sweep, *, detail: bool = False) -> dict[str, Any]:
    exp = session.get(Experiment, sweep.experiment_id)
    c = session.get(Cluster, sweep.cluster_id)
    spec = sweep.spec
    rows = trials(session, sweep)
    counts: dict[str, int] = {}
    for t in rows:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    top = best(session, sweep, rows)
    data: dict[str, Any] = {
        "name": sweep.name, "experiment": exp.name if exp else None,
        "cluster": c.name if c else spec.get("cluster"), "state": sweep.state,
        "message": sweep.message, "sampling": spec["sampling"]["type"],
        "objective": spec["objective"], "limits": spec["limits"],
        "early_termination": spec.get("early_termination"),
        "trials_created": len(rows), "trial_states": counts,
        "best": {"name": top["name"], "index": top["index"], "objective": top["objective"],
                 "params": top["params"]} if top else None,
        "created_at": sweep.created_at, "ended_at": sweep.ended_at,
        "created_by": sweep.created_by,
        "source_format": sweep.source_format,
    }
    if detail:
        data["trials"] = rows
        data["search_space"] = spec["search_space"]
        data["spec"] = SweepSpec.model_validate(spec).redacted()
    return data


def list_all(session: Session, workspace: str, experiment: str | None = None
             ) -> list[dict[str, Any]]:
    ws = common.workspace(session, workspace)
    query = select(Sweep).where(Sweep.workspace_id == ws.id)
    if experiment:
        query = query.where(Sweep.experiment_id == common.experiment(session, ws,
                                                                     experiment).id)
    return [sweep_dict(session, s) for s in session.scalars(query.order_by(Sweep.id))]


def show(session: Session, workspace: str, experiment: str, name: str) -> dict[str, Any]:
    return sweep_dict(session, find(session, workspace, experiment, name), detail=True)


def stop_job(session: Session, job: Job, reason: str) -> None:
    """Stop a trial's job, which then ends ``canceled`` with ``reason`` (not "terminated by
    user"): at once when it has not started, else through the reconciler."""
    if job.state not in JOB_ACTIVE or job.cancel_requested:
        return
    handed = session.scalar(select(Attempt.id).where(Attempt.job_id == job.id,
                                                     Attempt.state.in_(ATTEMPT_ACTIVE)))
    job.stop_reason = reason
    if job.state == "queued" and not handed:
        common.record(session, "job", job.id, "queued", "canceled", reason)
        job.state = "canceled"
        job.message = reason
        job.pending_reason = None
        job.ended_at = now()
        queue_mirror.changed(session, job.id)
        return
    job.cancel_requested = True
    common.record(session, "job", job.id, job.state, job.state, reason)
    kick_after_commit(session)


def cancel(session: Session, workspace: str, experiment: str, name: str) -> dict[str, Any]:
    """Idempotent: the sweep makes no more trials and its running ones are stopped; it is
    ``canceled`` once they have ended."""
    begin_write(session)  # trials' states read below stay true until the commit
    sweep = find(session, workspace, experiment, name)
    if sweep.state in SWEEP_ACTIVE and not sweep.cancel_requested:
        sweep.cancel_requested = True
        common.record(session, "sweep", sweep.id, sweep.state, sweep.state, "cancel requested")
        for job in session.scalars(select(Job).join(SweepTrial, SweepTrial.job_id == Job.id)
                                   .where(SweepTrial.sweep_id == sweep.id)):
            stop_job(session, job, f"canceled with sweep {sweep.name}")
        session.flush()
    return sweep_dict(session, sweep)


TERMINAL = JOB_TERMINAL
