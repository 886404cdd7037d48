"""MLflow ids of batchyard's objects. An experiment's id is its row id; a run's (a job's) is
32 hex digits: the job's id, then a digest of what only that job row holds, so an id is
neither guessed from a job's number nor valid for a job deleted and made again. A logged
model's id carries its job's id too (``m-<job><random>``), so its artifacts find their job."""

from __future__ import annotations

import hashlib
import re
import secrets

from batchyard.store.models import Job

_RUN = re.compile(r"^[0-9a-f]{32}$")
_MODEL = re.compile(r"^m-([0-9a-f]{8})[0-9a-f]{24}$")


def run_id(job: Job) -> str:
    digest = hashlib.sha256(f"batchyard-run:{job.id}:{job.submitted_at!r}:{job.directory}"
                            .encode()).hexdigest()
    return f"{job.id:08x}{digest[:24]}"


def job_id_of_run(run: str) -> int | None:
    """The job id a run id names (to be checked against ``run_id`` of that job)."""
    return int(run[:8], 16) if _RUN.match(run or "") else None


def new_model_id(job: Job) -> str:
    return f"m-{job.id:08x}{secrets.token_hex(12)}"


def job_id_of_model(model: str) -> int | None:
    found = _MODEL.match(model or "")
    return int(found.group(1), 16) if found else None


def experiment_id(value: str | int | None) -> int | None:
    text = str(value if value is not None else "").strip()
    return int(text) if text.isdigit() and len(text) < 10 else None
