"""azureml.core.ScriptRunConfig: a script (or command), its directory, a compute target, an
environment and a distributed configuration, turned into a batchyard job at submit."""

from __future__ import annotations

from typing import Any

from batchyard.compat.azureml import _submission as sub
from batchyard.compat.azureml._common import refuse
from batchyard.compat.azureml.core.runconfig import RunConfiguration
from batchyard.compat.azureml.exceptions import TrainingException


class ScriptRunConfig:
    def __init__(self, source_directory: str = ".", script: str | None = None,
                 arguments: list[Any] | None = None, run_config: RunConfiguration | None = None,
                 _telemetry_values: Any = None, compute_target: Any = None,
                 environment: Any = None, distributed_job_config: Any = None,
                 resume_from: Any = None, max_run_duration_seconds: float | None = None,
                 command: str | list[str] | None = None,
                 docker_runtime_config: Any = None) -> None:
        refuse("ScriptRunConfig", "not available in batchyard", resume_from=resume_from)
        self.docker_runtime_config = docker_runtime_config
        if script and command:
            raise TrainingException("ScriptRunConfig: give script or command, not both")
        self.source_directory = source_directory
        self.run_config = run_config or RunConfiguration()
        self.script = script or self.run_config.script
        self.arguments = list(arguments if arguments is not None else self.run_config.arguments)
        self.command = command if command is not None else self.run_config.command
        if compute_target is not None:
            self.run_config.target = compute_target
        if environment is not None:
            self.run_config.environment = environment
        self.distributed_job_config = distributed_job_config
        if max_run_duration_seconds is not None:
            self.run_config.max_run_duration_seconds = max_run_duration_seconds

    @property
    def compute_target(self) -> Any:
        return self.run_config.target

    def _to_submission(self, tags: dict[str, str] | None = None) -> sub.Submission:
        where = "ScriptRunConfig"
        training = self.distributed_job_config
        nodes = int(getattr(training, "node_count", 0) or self.run_config.node_count or 1)
        ppn = int(getattr(training, "process_count_per_node", 1) or 1)
        layout = sub.layout(node_count=nodes, process_count_per_node=1 if training else ppn,
                            backend=None, training=training, use_gpu=False, where=where)
        refs = [a for a in self.arguments if hasattr(a, "data_reference_name")]
        inputs, ref_env = sub.data_inputs(refs)
        docker = self.docker_runtime_config or getattr(self.run_config, "docker", None)
        parts = sub.environment_settings(self.run_config.environment, where, docker=docker)
        command: list[str] | str
        if self.command is not None:
            command = self.command if isinstance(self.command, str) else \
                [str(c) for c in self.command]
        elif self.script:
            command = ["python", self.script, *sub.script_arguments(self.arguments)]
        else:
            raise TrainingException(f"{where}: give script= or command=")
        return sub.build(where=where, source_directory=self.source_directory, command=command,
                         compute_target=self.run_config.target, layout_=layout,
                         pip_packages=parts.pip_packages, env={**parts.env, **ref_env},
                         inputs=inputs,
                         max_run_duration_seconds=self.run_config.max_run_duration_seconds,
                         tags=dict(tags or {}), environment=parts.environment)

    def to_job_spec(self) -> Any:
        """The batchyard JobSpec this configuration submits."""
        return self._to_submission().spec


__all__ = ["ScriptRunConfig"]
