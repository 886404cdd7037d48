"""Job arrays (``array: 0-99%8``, Slurm's ``--array``) and dependencies (``depends_on``,
Slurm's ``--dependency=afterok``): the spec side. Expanding an array into its jobs and
holding jobs back is the server's and the scheduler's work; this only parses and validates,
so a bad range is refused at submit naming the field."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from batchyard.spec.base import SpecModel

MAX_ARRAY = 10000  # jobs in one array (Slurm's default MaxArraySize is 1001)
_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

Condition = Literal["succeeded", "finished", "failed"]


class Dependency(SpecModel):
    """Run only once another job ended a certain way (Slurm afterok / afterany /
    afternotok)."""

    job: str = Field(pattern=NAME_RE, description="The job (or job array) waited for, by "
                     "name, in this job's experiment unless `experiment` is given.")
    condition: Condition = Field(
        "succeeded", description="succeeded: it must succeed (else this job fails); "
        "finished: it must end in any state; failed: it must fail or be canceled (else this "
        "job fails).")
    experiment: str | None = Field(None, pattern=NAME_RE,
                                   description="The experiment of that job (default: this "
                                   "job's).")


@dataclass(frozen=True)
class ArrayRange:
    """The indices of an array and how many of its jobs may run at once (None: no limit)."""

    indices: tuple[int, ...]
    limit: int | None

    @property
    def count(self) -> int:
        return len(self.indices)


def parse_array(text: str) -> ArrayRange:
    """``0-99%8``, ``1,3,5-7``, ``0-15:4%2`` (Slurm's syntax). ValueError says what is
    wrong in words a user can act on."""
    body, _, limit_text = str(text).strip().partition("%")
    limit: int | None = None
    if limit_text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ValueError(f"{text!r}: after % give how many may run at once (1 or more)")
        limit = int(limit_text)
    indices: set[int] = set()
    for part in body.split(","):
        match = _PART.match(part.strip())
        if not match:
            raise ValueError(f"{text!r}: {part.strip() or '(empty)'!r} is not N, N-M or "
                             "N-M:STEP (e.g. 0-99%8 or 1,3,5-7)")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        step = int(match.group(3)) if match.group(3) is not None else 1
        if last < first:
            raise ValueError(f"{text!r}: {part.strip()!r} ends before it starts")
        if step < 1:
            raise ValueError(f"{text!r}: {part.strip()!r}: the step must be 1 or more")
        if (last - first) // step + 1 + len(indices) > MAX_ARRAY:
            raise ValueError(f"{text!r}: more than {MAX_ARRAY} jobs in one array")
        indices.update(range(first, last + 1, step))
    if max(indices) >= 2**31:
        raise ValueError(f"{text!r}: indices must be below 2^31")
    return ArrayRange(tuple(sorted(indices)), limit)


def child_name(array: str, index: int) -> str:
    """``sim_7``: the job of index 7 of array ``sim`` (Slurm writes JOBID_7)."""
    return f"{array}_{index}"


def array_env(array: str, index: int, whole: ArrayRange, job_ref: str) -> dict[str, str]:
    """What a job of an array finds in its environment. Slurm's names, so scripts written
    for ``sbatch --array`` run unchanged, and batchyard's own. Neither Batch AI nor Azure
    Batch has an array index of its own to alias: ``AZ_BATCHAI_TASK_INDEX`` already means
    the node's rank within a job, and Azure Batch's parametric sweeps only name each task
    (``AZ_BATCH_TASK_ID``), so no Azure name is set."""
    return {
        "BATCHYARD_ARRAY_INDEX": str(index),
        "BATCHYARD_ARRAY_NAME": array,
        "BATCHYARD_ARRAY_COUNT": str(whole.count),
        "SLURM_ARRAY_TASK_ID": str(index),
        "SLURM_ARRAY_JOB_ID": job_ref,
        "SLURM_ARRAY_TASK_COUNT": str(whole.count),
        "SLURM_ARRAY_TASK_MIN": str(whole.indices[0]),
        "SLURM_ARRAY_TASK_MAX": str(whole.indices[-1]),
    }
