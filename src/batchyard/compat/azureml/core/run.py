"""azureml.core.run.Run: a batchyard job seen the Azure ML way.

``Run.get_context()`` inside a job talks to ``$BATCHYARD_API`` with the job-scoped
``$BATCHYARD_TOKEN``: ``run.log``/``log_list``/``log_row``/``log_table`` are batched in the
background (never blocking training, spooled to disk when the server is away, flushed at
exit and by ``run.complete()``/``run.flush()``; call one before ``os._exit``). Outside a job it
is an offline run that prints what it is given, as Azure ML's did.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchyard.compat.azureml import _details
from batchyard.compat.azureml._common import TERMINAL_STATUS, aml_status
from batchyard.compat.azureml._submission import aml_file_name
from batchyard.compat.azureml.exceptions import (
    ActivityFailedException,
    RunEnvironmentException,
    UnsupportedParameterError,
)
from batchyard.sdk import metrics
from batchyard.sdk.job import Job

if TYPE_CHECKING:
    from batchyard.compat.azureml.core.workspace import Workspace


class Run:
    """A run of an experiment (``experiment.submit`` returns one)."""

    _context: Run | None = None
    _context_lock = threading.Lock()
    type = "azureml.scriptrun"

    def __init__(self, experiment: Any, run_id: str, outer_run_id: str | None = None,
                 _run_dto: dict[str, Any] | None = None, **_ignored: Any) -> None:
        self.experiment = experiment
        self._id = run_id
        self._job = Job(experiment.workspace.sdk, experiment.name, run_id, data=_run_dto)
        self._in_job = False

    # identity --------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def name(self) -> str:
        return self._id

    display_name = name

    @property
    def job(self) -> Job:
        """The batchyard SDK job behind this run."""
        return self._job

    @property
    def parent(self) -> Run | None:
        return None

    def __repr__(self) -> str:
        return (f"Run(Experiment: {self.experiment.name},\nId: {self.id},\nType: {self.type},"
                f"\nStatus: {self.get_status()})")

    __str__ = __repr__

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in (
            ("Experiment", self.experiment.name), ("Id", self.id), ("Type", self.type),
            ("Status", self.get_status()), ("Details", self.get_portal_url())))
        return f"<table>{rows}</table>"

    @staticmethod
    def get(workspace: Workspace, run_id: str) -> Run:
        """The run of that id in any experiment of ``workspace``."""
        from batchyard.compat.azureml.core.experiment import Experiment
        from batchyard.compat.azureml.exceptions import UserErrorException

        for job in workspace.sdk.jobs():
            if job.name == run_id:
                return Run(Experiment._wrap(workspace, job.experiment), run_id, _run_dto=job.data)
        raise UserErrorException(f"run {run_id!r} not found in workspace {workspace.name!r}")

    @classmethod
    def get_context(cls, allow_offline: bool = True, used_for_context_manager: bool = False,
                    **_ignored: Any) -> Run:
        """This job's run inside a batchyard job; an offline run elsewhere."""
        with cls._context_lock:
            if Run._context is None:
                from batchyard.compat.azureml.core._context_runs import _JobRun, _OfflineRun

                ctx = metrics.JobContext.from_env()
                if ctx is not None:
                    Run._context = _JobRun(ctx)
                elif allow_offline:
                    Run._context = _OfflineRun()
                else:
                    raise RunEnvironmentException("Run.get_context(allow_offline=False) outside "
                                                  "a batchyard job")
            return Run._context

    # status ------------------------------------------------------------------------------------

    def get_status(self) -> str:
        return aml_status(self._job.state)

    @property
    def status(self) -> str:
        return self.get_status()

    def get_details(self) -> dict[str, Any]:
        data = self._job.refresh()
        try:
            files = self._job.files()
        except Exception:  # not started yet: no files
            files = []
        url = self._job.client.url + "/api/v1" + self._job.path + "/files/content"
        return _details.run_details(data, files, url)

    def get_details_with_logs(self) -> dict[str, Any]:
        details = self.get_details()
        logs = {}
        for name in details["logFiles"]:
            logs[name] = self._read_text(name)
        details["logFiles"] = logs
        return details

    def get_portal_url(self) -> str:
        """The run's page in the batchyard portal (the "Web View" link)."""
        return self._job.portal_url

    def wait_for_completion(self, show_output: bool = False, wait_post_processing: bool = False,
                            raise_on_error: bool = True) -> dict[str, Any]:
        """Block until the run ends; with ``show_output``, stream every rank's log live.
        Returns ``get_details()``; raises ActivityFailedException if it failed (unless
        ``raise_on_error=False``)."""
        if show_output:
            print(f"RunId: {self.id}\nWeb View: {self.get_portal_url()}\n")
            print("Streaming the logs of every rank ([node/rankN] before each line)")
            print("=" * 65 + "\n", flush=True)
            self._job.stream_logs(sys.stdout)
        self._job.wait()
        details = self.get_details()
        if show_output:
            print("\nExecution Summary\n=================")
            print(f"RunId: {self.id}\nWeb View: {self.get_portal_url()}\n", flush=True)
        if raise_on_error and details["status"] == "Failed":
            raise ActivityFailedException(error_details=json.dumps(details.get("error"),
                                                                   indent=4))
        return details

    def cancel(self) -> None:
        self._job.terminate()

    def complete(self, _set_status: bool = True) -> None:
        self.flush()

    def fail(self, error_details: Any = None, error_code: Any = None,
             _set_status: bool = True) -> None:
        self.flush()

    def flush(self, timeout_seconds: float = 300) -> bool:
        return True

    # metrics and tags --------------------------------------------------------------------------

    def _log(self, name: str, value: Any, kind: str, step: int | None) -> None:
        self._job.log_metric(name, value, step, kind)

    def log(self, name: str, value: Any, description: str = "", step: int | None = None) -> None:
        self._log(name, value, "scalar", step)

    def log_list(self, name: str, value: list[Any], description: str = "") -> None:
        self._log(name, list(value), "list", None)

    def log_row(self, name: str, description: str | None = None, **kwargs: Any) -> None:
        self._log(name, kwargs, "row", None)

    def log_table(self, name: str, value: dict[str, list[Any]], description: str = "") -> None:
        self._log(name, {k: list(v) for k, v in value.items()}, "table", None)

    def get_metrics(self, name: str | None = None, recursive: bool = False,
                    run_type: str | None = None, populate: bool = False) -> dict[str, Any]:
        return _details.aggregate_metrics(self._job.metrics(name))

    def tag(self, key: str, value: Any = None) -> None:
        self._job.set_tags({key: "" if value is None else str(value)})

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._job.set_tags({k: "" if v is None else str(v) for k, v in tags.items()})

    def remove_tags(self, tags: list[str]) -> None:
        self._job.set_tags(dict.fromkeys(tags))

    def get_tags(self) -> dict[str, str]:
        return self._job.tags()

    @property
    def tags(self) -> dict[str, str]:
        return self.get_tags()

    @property
    def properties(self) -> dict[str, Any]:
        return dict(self.get_details()["properties"])

    # files -------------------------------------------------------------------------------------

    def _names(self) -> dict[str, str]:
        """Azure ML file name -> batchyard path (``outputs/x`` is ``outputs/outputs/x``)."""
        return {aml_file_name(f["path"]): f["path"] for f in self._job.files()}

    def get_file_names(self) -> list[str]:
        return sorted(self._names())

    def _read_text(self, name: str) -> str:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = self.download_file(name, tmp)
            return Path(path).read_text(errors="replace")

    def download_file(self, name: str, output_file_path: str | None = None,
                      _validate_checksum: bool = False) -> str:
        names = self._names()
        if name not in names:
            from batchyard.compat.azureml.exceptions import UserErrorException

            raise UserErrorException(f"file {name!r} not found in run {self.id}; it has: "
                                     f"{', '.join(sorted(names)) or 'no files'}")
        dest = output_file_path or os.path.basename(name)
        return str(self._job.download(names[name], dest))

    def download_files(self, prefix: str | None = None, output_directory: str | None = None,
                       output_paths: list[str] | None = None, batch_size: int = 100,
                       append_prefix: bool = True, timeout_seconds: float | None = None
                       ) -> list[str]:
        """Download every file under ``prefix`` into ``output_directory`` (default: here),
        keeping paths (without the prefix when ``append_prefix=False``)."""
        base = Path(output_directory or ".")
        saved = []
        for name, path in sorted(self._names().items()):
            if prefix and not name.startswith(prefix):
                continue
            rel = name[len(prefix):].lstrip("/") if prefix and not append_prefix else name
            target = base / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            saved.append(str(self._job.download(path, target)))
        return saved

    def upload_file(self, name: str, path_or_stream: str) -> None:
        raise UnsupportedParameterError("upload_file", "outside its job a run's files are "
                                        "what the job wrote to ./outputs", "Run")

    def register_model(self, model_name: str, model_path: str | None = None,
                       **_ignored: Any) -> None:
        raise UnsupportedParameterError("register_model", "batchyard has no model registry; "
                                        "download the model with run.download_file", "Run")

    def get_children(self, **_ignored: Any) -> list[Run]:
        return []


__all__ = ["TERMINAL_STATUS", "Run"]
