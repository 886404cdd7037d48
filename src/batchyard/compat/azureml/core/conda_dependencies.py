"""azureml.core.conda_dependencies.CondaDependencies: pip packages are installed per job
(into the job's own directory); conda packages cannot be (no conda here) and are refused at
submit, naming them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

INTERPRETER = ("python", "pip")


def _name(requirement: str) -> str:
    for sep in ("=", "<", ">", "!", "~", " ", "["):
        requirement = requirement.split(sep, 1)[0]
    return requirement.strip().lower()


class CondaDependencies:
    def __init__(self, conda_dependencies_file_path: str | None = None,
                 _underlying_structure: dict[str, Any] | None = None) -> None:
        self._pip: list[str] = []
        self._conda: list[str] = []
        self.channels: list[str] = []
        structure = _underlying_structure
        if conda_dependencies_file_path:
            import yaml

            structure = yaml.safe_load(Path(conda_dependencies_file_path).read_text()) or {}
        for dep in (structure or {}).get("dependencies") or []:
            if isinstance(dep, dict):
                self._pip += [str(p) for p in dep.get("pip") or []]
            else:
                self._conda.append(str(dep))
        self.channels = list((structure or {}).get("channels") or [])

    @staticmethod
    def create(pip_packages: Iterable[str] | None = None,
               conda_packages: Iterable[str] | None = None, python_version: str | None = None,
               pin_sdk_version: bool = True, pip_indexurl: str | None = None,
               channels: Iterable[str] | None = None) -> CondaDependencies:
        deps = CondaDependencies()
        for package in pip_packages or ():
            deps.add_pip_package(package)
        for package in conda_packages or ():
            deps.add_conda_package(package)
        if python_version:
            deps.add_conda_package(f"python={python_version}")
        deps.channels = list(channels or [])
        return deps

    def add_pip_package(self, pip_package: str) -> None:
        if pip_package not in self._pip:
            self._pip.append(pip_package)

    def add_conda_package(self, conda_package: str) -> None:
        if conda_package not in self._conda:
            self._conda.append(conda_package)

    def remove_pip_package(self, pip_package: str) -> None:
        self._pip = [p for p in self._pip if _name(p) != _name(pip_package)]

    def remove_conda_package(self, conda_package: str) -> None:
        self._conda = [p for p in self._conda if _name(p) != _name(conda_package)]

    @property
    def pip_packages(self) -> list[str]:
        return list(self._pip)

    @property
    def conda_packages(self) -> list[str]:
        return list(self._conda)

    def packages_needing_conda(self) -> list[str]:
        """Conda packages other than the interpreter itself (python, pip)."""
        return [p for p in self._conda if _name(p) not in INTERPRETER]

    def serialize_to_string(self) -> str:
        import yaml

        deps: list[Any] = [*self._conda]
        if self._pip:
            deps.append({"pip": list(self._pip)})
        return str(yaml.safe_dump({"name": "project_environment", "channels": self.channels,
                                   "dependencies": deps}, sort_keys=False))


__all__ = ["CondaDependencies"]
