"""azureml.core.runconfig: distributed-training configurations and RunConfiguration."""

from __future__ import annotations

from typing import Any

from batchyard.compat.azureml.core.environment import Environment


class MpiConfiguration:
    """mpirun on node 0 over ``node_count`` nodes x ``process_count_per_node`` ranks."""

    def __init__(self, process_count_per_node: int = 1, node_count: int = 1) -> None:
        self.process_count_per_node = process_count_per_node
        self.node_count = node_count


class PyTorchConfiguration:
    """torch.distributed: ``process_count`` ranks in all (default one per node)."""

    def __init__(self, communication_backend: str = "Nccl", process_count: int | None = None,
                 node_count: int = 1) -> None:
        self.communication_backend = communication_backend
        self.process_count = process_count
        self.node_count = node_count


class TensorflowConfiguration:
    """TF_CONFIG for ``worker_count`` workers and ``parameter_server_count`` servers."""

    def __init__(self, worker_count: int = 1, parameter_server_count: int = 1) -> None:
        self.worker_count = worker_count
        self.parameter_server_count = parameter_server_count


class DockerConfiguration:
    def __init__(self, use_docker: bool = False, shm_size: str | None = None,
                 shared_volumes: bool = True, arguments: list[str] | None = None) -> None:
        self.use_docker = use_docker
        self.shm_size = shm_size
        self.shared_volumes = shared_volumes
        self.arguments = arguments or []


class RunConfiguration:
    """The settings a ScriptRunConfig may carry: node count, environment, limits."""

    def __init__(self, script: str | None = None, arguments: list[Any] | None = None,
                 framework: str = "Python", communicator: str = "None",
                 conda_dependencies: Any = None, command: str | list[str] | None = None,
                 **_ignored: Any) -> None:
        self.script = script
        self.arguments = list(arguments or [])
        self.command = command
        self.framework = framework
        self.communicator = communicator
        self.target: Any = None
        self.node_count = 1
        self.max_run_duration_seconds: float | None = None
        self.environment = Environment("batchyard-default")
        if conda_dependencies is not None:
            self.environment.python.conda_dependencies = conda_dependencies
        self.mpi = MpiConfiguration()
        self.tensorflow = TensorflowConfiguration()
        self.pytorch = PyTorchConfiguration()
        self.docker = DockerConfiguration()
        self.data_references: dict[str, Any] = {}

    @property
    def environment_variables(self) -> dict[str, str]:
        return self.environment.environment_variables

    @environment_variables.setter
    def environment_variables(self, value: dict[str, str]) -> None:
        self.environment.environment_variables = dict(value)


__all__ = ["DockerConfiguration", "MpiConfiguration", "PyTorchConfiguration",
           "RunConfiguration", "TensorflowConfiguration"]
