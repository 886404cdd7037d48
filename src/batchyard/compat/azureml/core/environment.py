"""azureml.core.Environment. A job runs on the interpreter batchyard runs on (or one named with
``python.user_managed_dependencies`` + ``python.interpreter_path``), or in the container
image ``docker.base_image`` names (pulled with ``docker.base_image_registry``'s login, used as
it is); pip packages are installed per job. Refused at submit, naming them: conda packages,
``docker.base_dockerfile`` (nothing builds images here) and ``docker.arguments``.
Curated environments (``Environment.get(ws, "AzureML-PyTorch-…")``) mean "the frameworks
installed here"; ``docker.enabled`` alone changes nothing (there is no image to run)."""

from __future__ import annotations

from typing import Any

from batchyard.compat.azureml.core.conda_dependencies import CondaDependencies
from batchyard.compat.azureml.core.container_registry import ContainerRegistry


class PythonSection:
    def __init__(self) -> None:
        self.user_managed_dependencies = False
        self.interpreter_path = "python"
        self.conda_dependencies = CondaDependencies()


class DockerSection:
    def __init__(self) -> None:
        self.enabled = False
        self.base_image: str | None = None
        self.base_dockerfile: str | None = None
        self.base_image_registry = ContainerRegistry()
        self.shm_size: str | None = None
        self.arguments: list[str] = []


class Environment:
    def __init__(self, name: str) -> None:
        self.name = name
        self.version: str | None = None
        self.python = PythonSection()
        self.docker = DockerSection()
        self.environment_variables: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"Environment(name={self.name!r})"

    @staticmethod
    def from_pip_requirements(name: str, file_path: str) -> Environment:
        env = Environment(name)
        with open(file_path) as fh:
            for line in fh:
                line = line.split("#", 1)[0].strip()
                if line:
                    env.python.conda_dependencies.add_pip_package(line)
        return env

    @staticmethod
    def from_conda_specification(name: str, file_path: str) -> Environment:
        env = Environment(name)
        env.python.conda_dependencies = CondaDependencies(file_path)
        return env

    @staticmethod
    def from_docker_image(name: str, image: str,
                          container_registry: ContainerRegistry | None = None,
                          conda_specification: str | None = None,
                          pip_requirements: str | None = None) -> Environment:
        env = Environment._with_packages(name, conda_specification, pip_requirements)
        env.docker.base_image = image
        if container_registry is not None:
            env.docker.base_image_registry = container_registry
        return env

    @staticmethod
    def from_dockerfile(name: str, dockerfile: str, conda_specification: str | None = None,
                        pip_requirements: str | None = None) -> Environment:
        """Kept so that the call reads; a job with it is refused at submit (no image
        builds here)."""
        env = Environment._with_packages(name, conda_specification, pip_requirements)
        env.docker.base_dockerfile = dockerfile
        return env

    @staticmethod
    def _with_packages(name: str, conda_specification: str | None,
                       pip_requirements: str | None) -> Environment:
        env = (Environment.from_conda_specification(name, conda_specification)
               if conda_specification else Environment(name))
        if pip_requirements:
            wanted = Environment.from_pip_requirements(name, pip_requirements)
            for package in wanted.python.conda_dependencies.pip_packages:
                env.python.conda_dependencies.add_pip_package(package)
        return env

    @staticmethod
    def get(workspace: Any, name: str, version: str | None = None) -> Environment:
        env = Environment(name)
        env.version = version
        return env

    def register(self, workspace: Any) -> Environment:
        return self


__all__ = ["DockerSection", "Environment", "PythonSection"]
