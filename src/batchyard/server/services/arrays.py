"""Job arrays and dependencies, the service side: an ``array:`` spec becomes one job per index
(``NAME_INDEX``, each with its index in the environment), submitted in one transaction; a
``depends_on`` entry is resolved to the job ids it names at submit, so that deleting and
re-creating a job of that name later does not change what an earlier job waits for.
Holding jobs back while they wait is ``services.holds`` and ``scheduler.holds``."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import Conflict, NotFound, SpecError
from batchyard.server.context import ServerContext
from batchyard.server.services import common
from batchyard.spec.arrays import Dependency, array_env, child_name, parse_array
from batchyard.spec.job import JobSpec
from batchyard.states import JOB_ACTIVE
from batchyard.store.models import Experiment, Job, Workspace

MAX_DEPENDENCY_JOBS = 10000


def resolve_dependencies(session: Session, ws: Workspace, exp: Experiment,
                         deps: list[Dependency]) -> list[dict[str, Any]]:
    """``[{job_id, job, condition}]`` for the dependencies of a job being submitted. A name
    may be a job or a job array (every job of it); one that names nothing is refused, naming
    the field."""
    out: list[dict[str, Any]] = []
    for i, dep in enumerate(deps):
        where = exp
        if dep.experiment and dep.experiment != exp.name:
            try:
                where = common.experiment(session, ws, dep.experiment)
            except NotFound:
                raise SpecError(f"depends_on[{i}].experiment: no experiment "
                                f"{dep.experiment!r} in workspace {ws.name!r}",
                                details=[{"field": f"depends_on[{i}].experiment",
                                          "message": "not found"}]) from None
        found = session.scalar(select(Job.id).where(Job.experiment_id == where.id,
                                                    Job.name == dep.job))
        ids = [found] if found is not None else list(session.scalars(
            select(Job.id).where(Job.experiment_id == where.id, Job.array_name == dep.job)
            .order_by(Job.array_index)))
        if not ids:
            raise SpecError(f"depends_on[{i}].job: no job or job array {dep.job!r} in "
                            f"experiment {where.name!r} (submit it first)",
                            details=[{"field": f"depends_on[{i}].job",
                                      "message": "no such job"}])
        if len(out) + len(ids) > MAX_DEPENDENCY_JOBS:
            raise SpecError(f"depends_on: more than {MAX_DEPENDENCY_JOBS} jobs")
        label = dep.job if where is exp else f"{where.name}/{dep.job}"
        out += [{"job_id": int(job_id), "job": label, "condition": dep.condition}
                for job_id in ids]
    return out


def submit(ctx: ServerContext, session: Session, workspace: str, spec: JobSpec, *,
           experiment: str | None, cluster: str | None, name: str | None,
           source_format: str, dry_run: bool, created_by: str | None = None
           ) -> dict[str, Any]:
    """One job per index of ``spec.array``, all in this transaction (all or none)."""
    from batchyard.server.services import jobs

    assert spec.array is not None
    whole = parse_array(spec.array)
    base = common.check_name("job", name or spec.name or f"array-{uuid.uuid4().hex[:8]}")
    last = child_name(base, whole.indices[-1])
    if len(last) > 64:
        raise SpecError(f"name: {base!r} is too long for an array of {whole.count} jobs "
                        f"({last!r} would be more than 64 characters)")
    ws = common.workspace(session, workspace)
    exp_name = experiment or spec.experiment or common.DEFAULT
    found = session.scalar(select(Experiment).where(Experiment.workspace_id == ws.id,
                                                    Experiment.name == exp_name))
    if found is not None and session.scalar(select(Job.id).where(
            Job.experiment_id == found.id,
            (Job.array_name == base) | (Job.name == base)).limit(1)):
        raise Conflict(f"a job or job array {base!r} already exists in experiment "
                       f"{exp_name!r}")
    code = spec.code
    if code and not code.startswith("snapshot:"):
        # packed once, not once per index
        code = f"snapshot:{jobs._code(ctx, spec, session, ws.name)}"
    submitted: list[dict[str, Any]] = []
    for index in whole.indices:
        child = spec.model_copy(update={
            "env": {**spec.env, **array_env(base, index, whole, base)}, "code": code})
        result = jobs.submit(ctx, session, workspace, child, experiment=experiment,
                             cluster=cluster, name=child_name(base, index),
                             source_format=source_format, dry_run=dry_run,
                             array=(base, index), created_by=created_by)
        if dry_run:
            return {**result, "array": base, "count": whole.count, "limit": whole.limit}
        submitted.append(result)
    first = submitted[0]
    return {"name": base, "array": base, "workspace": ws.name,
            "experiment": first["experiment"], "cluster": first["cluster"],
            "state": "queued", "count": whole.count, "limit": whole.limit,
            "pending_reason": first.get("pending_reason"),
            "jobs": [j["name"] for j in submitted], "source_format": source_format}


def _children(session: Session, workspace: str, experiment: str, name: str) -> list[Job]:
    ws = common.workspace(session, workspace)
    exp = common.experiment(session, ws, experiment)
    return list(session.scalars(select(Job).where(Job.experiment_id == exp.id,
                                                  Job.array_name == name)
                                .order_by(Job.array_index)))


def show(session: Session, workspace: str, experiment: str, name: str) -> dict[str, Any] | None:
    """A job array as a whole (None: there is no array of that name): its jobs and how many
    are in each state."""
    children = _children(session, workspace, experiment, name)
    if not children:
        return None
    spec = children[0].spec
    whole = parse_array(str(spec.get("array")))
    states = Counter(j.state for j in children)
    state = next((s for s in ("running", "preparing", "finalizing", "queued") if states[s]),
                 "failed" if states["failed"] else
                 "canceled" if states["canceled"] else "succeeded")
    return {"name": name, "array": name, "workspace": workspace, "experiment": experiment,
            "cluster": spec.get("cluster"), "state": state, "count": len(children),
            "limit": whole.limit, "spec_array": spec.get("array"),
            "job_states": dict(states),
            "jobs": [{"name": j.name, "index": j.array_index, "state": j.state,
                      "exit_code": j.exit_code,
                      "reason": j.pending_reason if j.state == "queued" else j.message}
                     for j in children]}


def terminate(ctx: ServerContext, session: Session, workspace: str, experiment: str,
              name: str) -> dict[str, Any] | None:
    """Terminate every job of an array that has not ended (None: no such array)."""
    from batchyard.server.services import jobs

    children = _children(session, workspace, experiment, name)
    if not children:
        return None
    for job in children:
        if job.state in JOB_ACTIVE:
            jobs.terminate(ctx, session, workspace, experiment, job.name)
    session.flush()
    return show(session, workspace, experiment, name)
