"""azureml.core.Environment. A job runs on the interpreter batchyard runs on (or one named with
``python.user_managed_dependencies`` + ``python.interpreter_path``); pip packages are
installed per job; conda packages and Docker images are refused at submit, naming them.
Curated environments (``Environment.get(ws, "AzureML-PyTorch-…")``) mean "the frameworks
installed here"."""

from __future__ import annotations

from typing import Any

from batchyard.compat.azureml.core.conda_dependencies import CondaDependencies


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
    def from_docker_image(name: str, image: str, **_ignored: Any) -> Environment:
        env = Environment(name)
        env.docker.base_image = image
        return env

    @staticmethod
    def get(workspace: Any, name: str, version: str | None = None) -> Environment:
        env = Environment(name)
        env.version = version
        return env

    def register(self, workspace: Any) -> Environment:
        return self


__all__ = ["DockerSection", "Environment", "PythonSection"]
