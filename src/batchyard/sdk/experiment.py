"""Experiments from Python, and submitting jobs to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchyard.client.http import Client
from batchyard.sdk.job import Job
from batchyard.sdk.workspace import Workspace
from batchyard.spec.job import JobSpec


class Experiment:
    """A named group of jobs in a workspace."""

    def __init__(self, workspace: Workspace | str, name: str, *,
                 data: dict[str, Any] | None = None) -> None:
        self.workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        self.name = name
        self.data: dict[str, Any] = data or {}

    def __repr__(self) -> str:
        return f"Experiment({self.workspace.name}/{self.name})"

    @property
    def client(self) -> Client:
        return self.workspace.client

    @classmethod
    def create(cls, workspace: Workspace | str, name: str, *,
               exist_ok: bool = False) -> Experiment:
        exp = cls(workspace, name)
        exp.data = exp.client.post(f"/workspaces/{exp.workspace.name}/experiments",
                                   {"name": name, "exist_ok": exist_ok})
        return exp

    def refresh(self) -> dict[str, Any]:
        self.data = self.client.get(f"/workspaces/{self.workspace.name}/experiments/{self.name}")
        return self.data

    def jobs(self, state: str | None = None) -> list[Job]:
        return self.workspace.jobs(experiment=self.name, state=state)

    def job(self, name: str) -> Job:
        job = Job(self.workspace, self.name, name)
        job.refresh()
        return job

    def submit(self, spec: JobSpec | dict[str, Any] | str | Path, *, name: str | None = None,
               cluster: str | None = None, code: str | Path | None = None,
               source_format: str | None = None, snapshot_limit: int | None = None) -> Job:
        """Submit a job: a :class:`JobSpec` (see the builders), its fields as a dict, or the
        path of a job file the CLI reads (``experiment.submit("job.yaml")``: native YAML,
        Batch AI ``job.json``, AML v2 YAML). A local code directory (``code=`` or
        ``spec.code``) is snapshotted now, honouring ``.amlignore``/``.gitignore`` and a size
        limit, and uploaded, so the job runs the code as it is at this moment."""
        if isinstance(spec, str | Path):
            from batchyard.sdk.builders import job_file_format, load_job

            source_format = source_format or job_file_format(spec)
            spec = load_job(spec)
        body = self._body(spec, code, snapshot_limit)
        result = self.client.submit(f"/workspaces/{self.workspace.name}/jobs", {
            "spec": body, "experiment": self.name, "cluster": cluster, "name": name,
            "source_format": source_format or "native"})
        return Job(self.workspace, result["experiment"], result["name"], data=result)

    def dry_run(self, spec: JobSpec | dict[str, Any] | str | Path, *, name: str | None = None,
                cluster: str | None = None, code: str | Path | None = None) -> str:
        """What would run on each node (commands and environment, secrets masked)."""
        if isinstance(spec, str | Path):
            from batchyard.sdk.builders import load_job

            spec = load_job(spec)
        body = self._body(spec, code, None)
        result = self.client.post(f"/workspaces/{self.workspace.name}/jobs", {
            "spec": body, "experiment": self.name, "cluster": cluster, "name": name,
            "dry_run": True})
        return str(result["plan"])

    def _body(self, spec: JobSpec | dict[str, Any], code: str | Path | None,
              snapshot_limit: int | None) -> dict[str, Any]:
        model = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec)
        body = model.model_dump(mode="json", exclude_none=True)
        source = str(code) if code is not None else model.code
        if source and not source.startswith("snapshot:"):
            from batchyard.snapshot import DEFAULT_LIMIT, pack

            data = pack(source, snapshot_limit or DEFAULT_LIMIT)
            body["code"] = f"snapshot:{self.client.upload_snapshot(data)}"
        elif source:
            body["code"] = source
        return body
