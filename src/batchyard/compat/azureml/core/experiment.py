"""azureml.core.Experiment: a batchyard experiment; ``submit`` snapshots the configuration's
``source_directory`` and submits the job it describes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from batchyard import errors
from batchyard.compat.azureml._submission import new_run_id
from batchyard.compat.azureml.exceptions import ExperimentExecutionException, UserErrorException
from batchyard.sdk.experiment import Experiment as _SdkExperiment

if TYPE_CHECKING:
    from batchyard.compat.azureml.core.run import Run
    from batchyard.compat.azureml.core.workspace import Workspace


class Experiment:
    def __init__(self, workspace: Workspace, name: str, _skip_name_validation: bool = False,
                 **_ignored: Any) -> None:
        self.workspace = workspace
        self.name = name
        try:
            self._sdk = _SdkExperiment.create(workspace.sdk, name, exist_ok=True)
        except errors.UserError as exc:
            raise UserErrorException(exc.message) from None

    @classmethod
    def _wrap(cls, workspace: Workspace, name: str) -> Experiment:
        obj = cls.__new__(cls)
        obj.workspace = workspace
        obj.name = name
        obj._sdk = _SdkExperiment(workspace.sdk, name)
        return obj

    def __repr__(self) -> str:
        return f"Experiment(Name: {self.name},\nWorkspace: {self.workspace.name})"

    @staticmethod
    def list(workspace: Workspace, experiment_name: str | None = None,
             **_ignored: Any) -> list[Experiment]:
        found = workspace.experiments
        return [e for n, e in sorted(found.items()) if experiment_name in (None, n)]

    def submit(self, config: Any, tags: dict[str, str] | None = None, **kwargs: Any) -> Any:
        """Submit an Estimator, PyTorch/TensorFlow/Chainer estimator or ScriptRunConfig (a
        Run), or a HyperDriveConfig (a HyperDriveRun: a batchyard sweep)."""
        from batchyard.compat.azureml.core.run import Run

        submit_sweep = getattr(config, "_submit_to", None)
        if submit_sweep is not None:
            return submit_sweep(self, tags)
        to_submission = getattr(config, "_to_submission", None)
        if to_submission is None:
            raise ExperimentExecutionException(
                f"cannot submit {type(config).__name__}: give an Estimator, PyTorch, "
                "TensorFlow, Chainer or ScriptRunConfig")
        submission = to_submission(tags)
        run_id = new_run_id(self.name)
        try:
            job = self._sdk.submit(submission.spec, name=run_id,
                                   cluster=submission.compute_target,
                                   code=submission.source_directory, source_format="azureml-sdk")
        except errors.UserError as exc:
            raise UserErrorException(exc.message) from None
        return Run(self, job.name, _run_dto=job.data)

    def get_runs(self, type: str | None = None, tags: Any = None, properties: Any = None,
                 include_children: bool = False) -> Iterator[Run]:
        """This experiment's runs, newest first."""
        from batchyard.compat.azureml.core.run import Run

        for job in reversed(self._sdk.jobs()):
            run = Run(self, job.name, _run_dto=job.data)
            if tags:
                wanted = tags if isinstance(tags, dict) else {tags: None}
                have = (job.data.get("tags") or run.get_tags())
                if any(k not in have or (v is not None and have[k] != v)
                       for k, v in wanted.items()):
                    continue
            yield run


__all__ = ["Experiment"]
