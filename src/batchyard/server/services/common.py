"""Lookups, serialisation and the event log shared by the services."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from batchyard.errors import NotFound, SpecError
from batchyard.spec.cluster import DEFAULT_OUTPUT, DEFAULT_PIDS
from batchyard.states import NODE_STATES as STATES_OF_NODES
from batchyard.store.models import Attempt, Cluster, Event, Experiment, Job, Node, Workspace, now
from batchyard.suggest import did_you_mean

DEFAULT = "default"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
NODE_STATES = STATES_OF_NODES


def check_name(kind: str, name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise SpecError(
            f"{kind} name {name!r} is invalid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def record(session: Session, kind: str, entity_id: int, from_state: str | None,
           to_state: str | None, message: str | None = None) -> None:
    session.add(Event(kind=kind, entity_id=entity_id, from_state=from_state, to_state=to_state,
                      message=message, ts=now()))


def workspace(session: Session, name: str, *, create_default: bool = True) -> Workspace:
    ws = session.scalar(select(Workspace).where(Workspace.name == name))
    if ws is None:
        if name == DEFAULT and create_default:
            try:  # first use: requests arriving together may all make it; one does
                with session.begin_nested():
                    ws = Workspace(name=DEFAULT)
                    session.add(ws)
                    session.flush()
                return ws
            except IntegrityError:
                ws = session.scalar(select(Workspace).where(Workspace.name == name))
                if ws is None:
                    raise
                return ws
        raise NotFound(f"workspace {name!r} not found"
                       + did_you_mean(name, known(session, select(Workspace.name))))
    return ws


def cluster(session: Session, ws: Workspace, name: str) -> Cluster:
    found = session.scalar(
        select(Cluster).where(Cluster.workspace_id == ws.id, Cluster.name == name,
                              Cluster.deleting.is_(False))
    )
    if found is None:
        raise cluster_not_found(session, ws, name)
    return found


def cluster_not_found(session: Session, ws: Workspace, name: str) -> NotFound:
    names = known(session, select(Cluster.name).where(Cluster.workspace_id == ws.id,
                                                       Cluster.deleting.is_(False)))
    return NotFound(f"cluster {name!r} not found in workspace {ws.name!r}"
                    + did_you_mean(name, names))


def known(session: Session, query: Any, limit: int = 5000) -> list[str]:
    """Names an unknown one may be compared with ("did you mean ...?"); the newest
    ``limit`` when there are more."""
    return [str(n) for n in session.scalars(query.limit(limit))]


def experiment(session: Session, ws: Workspace, name: str, *,
               create: bool = False) -> Experiment:
    found = session.scalar(
        select(Experiment).where(Experiment.workspace_id == ws.id, Experiment.name == name)
    )
    if found is None:
        if create:
            found = Experiment(workspace_id=ws.id, name=check_name("experiment", name))
            session.add(found)
            session.flush()
            return found
        names = known(session, select(Experiment.name).where(Experiment.workspace_id == ws.id))
        raise NotFound(f"experiment {name!r} not found in workspace {ws.name!r}"
                       + did_you_mean(name, names))
    return found


def job(session: Session, exp: Experiment, name: str) -> Job:
    found = session.scalar(select(Job).where(Job.experiment_id == exp.id, Job.name == name))
    if found is None:
        names = known(session, select(Job.name).where(Job.experiment_id == exp.id)
                      .order_by(Job.id.desc()))
        raise NotFound(f"job {name!r} not found in experiment {exp.name!r}"
                       + did_you_mean(name, names))
    return found


_JOB_BY_NAMES = (select(Job, Experiment, Workspace, Cluster)
                 .join(Experiment, Experiment.id == Job.experiment_id)
                 .join(Workspace, Workspace.id == Experiment.workspace_id)
                 .outerjoin(Cluster, Cluster.id == Job.cluster_id)
                 .where(Workspace.name == bindparam("workspace"),
                        Experiment.name == bindparam("experiment"),
                        Job.name == bindparam("job")))
HELD = "batchyard_held_rows"


def job_by_names(session: Session, workspace: str, experiment: str, name: str) -> Job | None:
    """The job, its experiment, workspace and cluster loaded in one query; None when any is
    missing (the caller looks them up one by one, to say which). The session's identity map
    holds objects weakly: the row is kept in ``session.info`` for the session's life, else
    the parents were collected at once and ``jobs.job_dict``'s gets read each one again (a
    third of a job GET's CPU)."""
    row = session.execute(_JOB_BY_NAMES, {"workspace": workspace, "experiment": experiment,
                                          "job": name}).first()
    if row is None:
        return None
    session.info.setdefault(HELD, []).append(tuple(row))
    return row[0]


def workspace_dict(ws: Workspace) -> dict[str, Any]:
    return {"name": ws.name, "location": ws.location, "subscription_id": ws.subscription_id,
            "resource_group": ws.resource_group, "created_at": ws.created_at,
            "mlflow_uri": ws.mlflow_uri}


def node_dict(node: Node) -> dict[str, Any]:
    from batchyard.node.gpus import label
    from batchyard.server.services.health import view

    devices = (node.resources or {}).get("gpu_devices") or []
    return {"name": node.name, "index": node.index, "address": node.address,
            "state": node.state, "reason": node.reason, "resources": node.resources,
            "job_id": node.job_id, "directory": node.directory, "idle_since": node.idle_since,
            "ready_at": node.ready_at, "gpu_devices": [label(d) for d in devices],
            "health": view(node)}


def gpu_models(devices: list[dict[str, Any]]) -> list[str]:
    from batchyard.node.gpus import models

    return models(devices)


def cluster_dict(session: Session, c: Cluster, *, with_nodes: bool = False) -> dict[str, Any]:
    nodes = list(session.scalars(select(Node).where(Node.cluster_id == c.id).order_by(Node.index)))
    counts = Counter(n.state for n in nodes)
    spec = c.spec
    data: dict[str, Any] = {
        "name": c.name,
        "backend": c.backend,
        "vm_size": c.size.get("name"),
        "size": c.size,
        "vm_priority": spec.get("vm_priority", "dedicated"),
        "scale": {"manual": spec.get("manual")} if spec.get("manual")
        else {"autoscale": spec.get("autoscale")},
        "allocation_state": "resizing" if c.state == "resizing" else "steady",
        "target_nodes": c.target_nodes,
        "current_nodes": len(nodes),
        "node_counts": {state: counts.get(state, 0) for state in NODE_STATES},
        "created_at": c.created_at,
        # the GPUs the nodes really have (nvidia-smi's names), not the size table's model
        "gpu_models": gpu_models([d for n in nodes
                                  for d in (n.resources or {}).get("gpu_devices") or []]),
    }
    if spec.get("slurm") is not None or c.backend == "slurm":
        data["slurm"] = dict(spec.get("slurm") or {})  # partition and sbatch options
    for key in ("auto_storage", "image"):  # Batch AI's --use-auto-storage and -i
        if spec.get(key):
            data[key] = spec[key]
    # who the jobs run as on the nodes and their limits per node (issue 32)
    data["allow_root_jobs"] = bool(spec.get("allow_root_jobs"))
    data["max_pids"] = int(spec.get("max_pids") or DEFAULT_PIDS)
    data["max_output"] = int(spec.get("max_output") or DEFAULT_OUTPUT)
    if spec.get("health_check_every"):  # periodic node health checks (issue 36)
        data["health_check_every"] = float(spec["health_check_every"])
        data["health_check_passes"] = int(spec.get("health_check_passes") or 3)
    if c.state == "error":  # the reconciler's pass for it failed (nodes.broken): why
        why = session.scalar(select(Event.message).where(
            Event.kind == "cluster", Event.entity_id == c.id, Event.to_state == "error")
            .order_by(Event.id.desc()).limit(1))
        data["errors"] = [{"code": "ReconcileFailed", "message": why}]
    if with_nodes:
        data["nodes"] = [node_dict(n) for n in nodes]
    return data


def experiment_dict(session: Session, e: Experiment) -> dict[str, Any]:
    states = Counter(session.scalars(select(Job.state).where(Job.experiment_id == e.id)))
    return {"name": e.name, "created_at": e.created_at, "jobs": sum(states.values()),
            "job_states": dict(states)}


def attempt_dict(a: Attempt) -> dict[str, Any]:
    return {"number": a.number, "uuid": a.uuid, "state": a.state, "exit_code": a.exit_code,
            "message": a.message, "error": a.error, "directory": a.directory,
            "node_ids": a.node_ids, "straggler": a.straggler,
            "created_at": a.created_at, "started_at": a.started_at, "ended_at": a.ended_at,
            # the backend's own id of the attempt (a Slurm job id), as users know it there
            "slurm_job_id": (a.handle or {}).get("slurm_job_id")}
