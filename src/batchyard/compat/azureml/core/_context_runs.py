"""The runs ``Run.get_context()`` returns: the job's own run inside a batchyard job (metrics
through the background reporter, with the job token), an offline run elsewhere."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from batchyard.compat.azureml import _details
from batchyard.compat.azureml._submission import AML_OUTPUTS
from batchyard.compat.azureml.core.run import Run
from batchyard.compat.azureml.exceptions import RunEnvironmentException, UnsupportedParameterError
from batchyard.sdk import metrics
from batchyard.sdk.job import Job


class _ContextExperiment:
    """The experiment of the run a process is part of (names only; no admin access)."""

    def __init__(self, name: str, workspace_name: str) -> None:
        self.name = name
        self.workspace_name = workspace_name

    @property
    def workspace(self) -> Any:
        from batchyard.compat.azureml.core.workspace import Workspace

        return Workspace(workspace_name=self.workspace_name)


class _JobRun(Run):
    """``Run.get_context()`` inside a job: metrics go through the background reporter."""

    def __init__(self, ctx: metrics.JobContext) -> None:
        from batchyard.sdk._client import in_job_client
        from batchyard.sdk.workspace import Workspace as SdkWorkspace

        self.experiment = _ContextExperiment(ctx.experiment, ctx.workspace)
        self._id = ctx.job
        self._ctx = ctx
        self._job = Job(SdkWorkspace(ctx.workspace, client=in_job_client()), ctx.experiment,
                        ctx.job)
        self._in_job = True

    def _log(self, name: str, value: Any, kind: str, step: int | None) -> None:
        reporter = metrics.reporter()
        assert reporter is not None
        reporter.emit(name, value, kind, step)

    def get_status(self) -> str:
        return "Running"

    def get_details(self) -> dict[str, Any]:
        return {"runId": self.id, "status": "Running", "target": None,
                "properties": {"batchyard.workspace": self._ctx.workspace,
                               "batchyard.experiment": self._ctx.experiment,
                               "batchyard.attempt": str(self._ctx.attempt)}}

    def flush(self, timeout_seconds: float = 300) -> bool:
        return metrics.flush(timeout_seconds)

    def get_metrics(self, name: str | None = None, recursive: bool = False,
                    run_type: str | None = None, populate: bool = False) -> dict[str, Any]:
        self.flush(30)
        return super().get_metrics(name)

    def wait_for_completion(self, show_output: bool = False, wait_post_processing: bool = False,
                            raise_on_error: bool = True) -> dict[str, Any]:
        return self.get_details()

    def cancel(self) -> None:
        raise UnsupportedParameterError("cancel", "a run cannot cancel itself; exit instead",
                                        "Run.get_context()")

    def _outputs(self) -> Path:
        return Path(os.environ.get("BATCHYARD_OUTPUT_OUTPUTS") or "outputs")

    def get_file_names(self) -> list[str]:
        names = []
        for folder, ident in AML_OUTPUTS.items():
            root = Path(os.environ.get(f"BATCHYARD_OUTPUT_{ident}") or folder)
            if root.is_dir():
                names += [f"{folder}/{p.relative_to(root).as_posix()}"
                          for p in root.rglob("*") if p.is_file()]
        return sorted(names)

    def upload_file(self, name: str, path_or_stream: str) -> None:
        """Keep a file with the run (under ./outputs)."""
        rel = name[len("outputs/"):] if name.startswith("outputs/") else name
        target = self._outputs() / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path_or_stream, target)


class _OfflineRun(Run):
    """Outside a job: values are printed and kept in this process."""

    def __init__(self) -> None:
        self.experiment = _ContextExperiment("offline", "offline")
        self._id = f"OfflineRun_{uuid.uuid4()}"
        self._tags: dict[str, str] = {}
        self._in_job = False

    @property
    def _job(self) -> Job:  # type: ignore[override]
        raise RunEnvironmentException("an offline run (outside a batchyard job) has no job "
                                      "on a server")

    def _log(self, name: str, value: Any, kind: str, step: int | None) -> None:
        metrics._log(name, value, kind, step)

    def get_status(self) -> str:
        return "Running"

    def get_details(self) -> dict[str, Any]:
        return {"runId": self.id, "status": "Running", "target": "local", "properties": {}}

    def get_metrics(self, name: str | None = None, recursive: bool = False,
                    run_type: str | None = None, populate: bool = False) -> dict[str, Any]:
        rows = [r for r in metrics.offline_metrics() if name is None or r["name"] == name]
        return _details.aggregate_metrics(rows)

    def tag(self, key: str, value: Any = None) -> None:
        self._tags[key] = "" if value is None else str(value)

    def set_tags(self, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self.tag(key, value)

    def get_tags(self) -> dict[str, str]:
        return dict(self._tags)

    def wait_for_completion(self, show_output: bool = False, wait_post_processing: bool = False,
                            raise_on_error: bool = True) -> dict[str, Any]:
        return self.get_details()

    def get_portal_url(self) -> str:
        return "(offline run)"

    def get_file_names(self) -> list[str]:
        return []
