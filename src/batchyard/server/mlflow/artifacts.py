"""MLflow's artifacts proxy (``mlflow-artifacts:/...``, what ``mlflow.log_artifact`` and
``log_model`` upload through): a run's artifacts are files of its job's outputs on the server,
``outputs/mlflow/<path>`` of the job's latest attempt (``job file list``, the portal and
``job file download`` show them), a logged model's ``outputs/mlflow-models/<model id>/``.
Every path is opened as the rest of a job's files are (services/files.py): component by
component, never through a link."""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.server.auth import Principal
from batchyard.server.mlflow import models, runs
from batchyard.server.mlflow.errors import MlflowError, invalid, not_found
from batchyard.server.services import files
from batchyard.store.models import Attempt, Job

RUN_FOLDER = "mlflow"
MODEL_FOLDER = "mlflow-models"


@dataclass
class Target:
    attempt_dir: str
    parts: list[str]  # under the attempt dir: outputs/mlflow/...
    shown: str  # the path as the client named it


def _split(path: str) -> list[str]:
    parts = [p for p in (path or "").strip("/").split("/") if p]
    if any(p in (".", "..") or "\x00" in p for p in parts):
        raise invalid(f"path: {path!r} is not a plain relative path")
    return parts


def resolve(session: Session, principal: Principal, path: str) -> Target:
    """``<experiment id>/<run id>/artifacts/...`` or ``<experiment id>/models/<model
    id>/artifacts/...``, for this principal."""
    parts = _split(path)
    if len(parts) >= 4 and parts[1] == "models" and parts[3] == "artifacts":
        job, _ = models.job_of_model(session, principal, parts[2])
        inner = [MODEL_FOLDER, parts[2], *parts[4:]]
    elif len(parts) >= 3 and parts[2] == "artifacts":
        job = runs.job_of_run(session, principal, parts[1])
        inner = [RUN_FOLDER, *parts[3:]]
    else:
        raise not_found(f"artifact path {path!r}: expected EXPERIMENT/RUN/artifacts/...")
    if parts[0] != str(job.experiment_id):
        raise not_found(f"artifact path {path!r}: the run is in experiment "
                        f"{job.experiment_id}")
    return Target(_attempt_dir(session, job), ["outputs", *inner], path)


def _attempt_dir(session: Session, job: Job) -> str:
    attempt = session.scalar(select(Attempt).where(Attempt.job_id == job.id)
                             .order_by(Attempt.number.desc()).limit(1))
    if attempt is None:
        raise MlflowError("INVALID_STATE", f"job {job.name!r} has not started: its run has "
                          "no artifacts yet")
    return attempt.directory


def start_upload(target: Target) -> tuple[int, str, str, int]:
    """(folder fd, temporary name, final name, file fd): the caller writes the file, then
    ``finish_upload`` (or ``abort_upload``)."""
    if target.parts[-1] in (RUN_FOLDER, MODEL_FOLDER) or len(target.parts) < 3:
        raise invalid(f"path: {target.shown!r} names no file")
    Path(target.attempt_dir).parent.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder = files.dir_under(target.attempt_dir, target.parts[:-1], create=True)
    except OSError as exc:
        raise invalid(f"path: {target.shown!r}: not a plain directory on the server "
                      f"({exc})") from None
    tmp = f".{target.parts[-1][:100]}.{uuid.uuid4().hex[:8]}.part"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o640, dir_fd=folder)
    except OSError:
        os.close(folder)
        raise
    return folder, tmp, target.parts[-1], fd


def finish_upload(folder: int, tmp: str, name: str, fd: int) -> None:
    try:
        os.close(fd)
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            os.unlink(tmp, dir_fd=folder)
            raise invalid(f"{name!r} exists on the server and is not a file")
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)


def abort_upload(folder: int, tmp: str, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp, dir_fd=folder)
    os.close(folder)


def listing(target: Target) -> dict[str, Any]:
    """The entries of one folder, named relative to it (as MLflow's server answers)."""
    try:
        folder = files.dir_under(target.attempt_dir, target.parts)
    except OSError:
        return {}
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith(".") or entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    found.append({"path": entry.name, "is_dir": True})
                elif entry.is_file(follow_symlinks=False):
                    found.append({"path": entry.name, "is_dir": False,
                                  "file_size": entry.stat(follow_symlinks=False).st_size})
    finally:
        os.close(folder)
    found.sort(key=lambda f: str(f["path"]))
    return {"files": found} if found else {}


def open_file(target: Target) -> files.Download:
    try:
        fd = files.open_under(target.attempt_dir, target.parts)
    except OSError:
        raise not_found(f"artifact {target.shown!r} not found") from None
    return files.Download(fd=fd, name=target.parts[-1], size=os.fstat(fd).st_size)
