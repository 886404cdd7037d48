"""Reading a job or cluster file in any accepted format (DESIGN §3) into the one native spec.

The format is told from the content, not the file name, so a Batch AI ``job.json`` renamed to
``.yaml`` (or an AML job saved as JSON) still reads correctly. Relative local paths are made
absolute against the job file's directory, because the server, not the user's shell, is what
later resolves them.
"""

from __future__ import annotations

import os
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from batchyard.errors import SpecError
from batchyard.spec.cluster import ClusterSpec
from batchyard.spec.documents import (  # noqa: F401  (re-exported)
    BATCHAI_KEYS,
    JobFormat,
    detect_job_format,
    read_document,
)
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import JobSpec

# Each format's reader is imported for a file of that format only (a native job needs neither
# Batch AI's schema nor AML's: issue 37, the CLI's start-up).
_BATCHAI_CLUSTER_KEYS = frozenset({"vmSize", "scaleSettings", "vmPriority", "nodeSetup"})


def _is_relative_local(path: str | None) -> bool:
    return bool(path) and not (
        os.path.isabs(str(path))
        or str(path).startswith(("$", "~", "azureml:"))
        or "://" in str(path)
    )


def _absolute(spec: JobSpec, base: Path) -> JobSpec:
    def fix(path: str) -> str:
        return os.path.normpath(base / path)

    update: dict[str, Any] = {}
    if spec.code and _is_relative_local(spec.code):
        update["code"] = fix(spec.code)
    update["inputs"] = {
        key: item.model_copy(update={"path": fix(item.path)})
        if _is_relative_local(item.path) else item
        for key, item in spec.inputs.items()
    }
    update["mounts"] = [
        m.model_copy(update={"source": fix(m.source)})
        if m.kind == "local" and _is_relative_local(m.source) else m
        for m in spec.mounts
    ]
    return spec.model_copy(update=update)


def load_job_dict(
    data: Any, source: str = "job", ignore: AbstractSet[str] = frozenset(),
    *, base_dir: Path | None = None,
) -> JobSpec:
    """A job given as parsed data (the API's request body, or a file's content)."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of job fields at the top level")
    fmt = detect_job_format(data)
    if fmt == "batchai":
        from batchyard.spec.batchai import read_batchai_job

        spec = read_batchai_job(data, ignore=ignore, source=source)
    elif fmt == "aml":
        from batchyard.spec.amlv2 import read_aml_job

        spec = read_aml_job(data, source=source)
    else:
        try:
            spec = JobSpec.model_validate(data)
        except ValidationError as exc:
            raise spec_error_from(exc, source=source, model=JobSpec) from None
    return _absolute(spec, base_dir) if base_dir is not None else spec


def load_job_file(path: Path, *, ignore: AbstractSet[str] = frozenset()) -> JobSpec:
    """A job file in any accepted format; relative local paths resolve against its folder."""
    path = Path(path)
    return load_job_dict(
        read_document(path), path.name, ignore, base_dir=path.absolute().parent
    )


def load_cluster_dict(
    data: Any, source: str = "cluster", name: str | None = None,
    ignore: AbstractSet[str] = frozenset(),
) -> ClusterSpec:
    """A cluster as parsed data; ``name`` (the CLI's ``-n``) wins over a name in the data."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of cluster fields at the top level")
    is_batchai = "properties" in data or bool(_BATCHAI_CLUSTER_KEYS & set(data))
    chosen = name or (None if is_batchai else data.get("name"))
    if not chosen:
        raise SpecError(f"{source}: name: give the cluster a name")
    if is_batchai:
        from batchyard.spec.batchai import read_batchai_cluster

        return read_batchai_cluster(data, str(chosen), ignore=ignore, source=source)
    try:
        return ClusterSpec.model_validate({**data, "name": chosen})
    except ValidationError as exc:
        raise spec_error_from(exc, source=source, model=ClusterSpec) from None


def load_cluster_file(
    path: Path, name: str | None = None, *, ignore: AbstractSet[str] = frozenset()
) -> ClusterSpec:
    """A Batch AI cluster.json or native cluster YAML; unnamed, it is named after the file."""
    path = Path(path)
    data = read_document(path)
    if name is None and isinstance(data, dict) and not data.get("name"):
        name = path.stem
    return load_cluster_dict(data, path.name, name, ignore)
