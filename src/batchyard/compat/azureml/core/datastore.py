"""azureml.core.datastore.Datastore: the workspace's default datastore is a directory that
batchyard keeps (``$BATCHYARD_DATA_ROOT/datastores/<workspace>/workspaceblobstore``, on the
machine of the local server). Registering Azure Blob, File or other stores is refused: the
storage work of batchyard adds them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from batchyard.compat.azureml.data.data_reference import DataReference
from batchyard.compat.azureml.exceptions import UnsupportedParameterError, UserErrorException
from batchyard.config import data_root

DEFAULT_NAME = "workspaceblobstore"


class Datastore:
    def __init__(self, workspace: Any, name: str | None = None) -> None:
        self.workspace = workspace
        self.name = name or DEFAULT_NAME
        if self.name != DEFAULT_NAME:
            raise UserErrorException(f"datastore {self.name!r} not found; batchyard has the "
                                     f"default datastore {DEFAULT_NAME!r}")
        self.datastore_type = "Local"
        self.container_name: str | None = None
        self.account_name: str | None = None
        self.root = data_root() / "datastores" / workspace.name / self.name
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"Datastore(name={self.name!r}, root={str(self.root)!r})"

    @staticmethod
    def get(workspace: Any, datastore_name: str) -> Datastore:
        return Datastore(workspace, datastore_name)

    @staticmethod
    def get_default(workspace: Any) -> Datastore:
        return Datastore(workspace, DEFAULT_NAME)

    @staticmethod
    def register_azure_blob_container(*_args: Any, **_kwargs: Any) -> Datastore:
        raise UnsupportedParameterError("register_azure_blob_container", "only the local "
                                        "default datastore exists in this version", "Datastore")

    @staticmethod
    def register_azure_file_share(*_args: Any, **_kwargs: Any) -> Datastore:
        raise UnsupportedParameterError("register_azure_file_share", "only the local default "
                                        "datastore exists in this version", "Datastore")

    def _target(self, target_path: str | None) -> Path:
        target = (self.root / (target_path or "")).resolve()
        if target != self.root.resolve() and self.root.resolve() not in target.parents:
            raise UserErrorException(f"target_path {target_path!r} leaves the datastore")
        return target

    def upload(self, src_dir: str, target_path: str | None = None, overwrite: bool = False,
               show_progress: bool = True) -> DataReference:
        """Copy a directory tree into the datastore."""
        source = Path(src_dir)
        target = self._target(target_path)
        count = 0
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            dest = target / path.relative_to(source)
            if dest.exists() and not overwrite:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
            count += 1
            if show_progress:
                print(f"Uploading {path}")
        if show_progress:
            print(f"Uploaded {count} files")
        return DataReference(self, path_on_datastore=target_path)

    def upload_files(self, files: list[str], relative_root: str | None = None,
                     target_path: str | None = None, overwrite: bool = False,
                     show_progress: bool = True) -> DataReference:
        target = self._target(target_path)
        for name in files:
            path = Path(name)
            rel = path.relative_to(relative_root) if relative_root else Path(path.name)
            dest = target / rel
            if dest.exists() and not overwrite:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
            if show_progress:
                print(f"Uploading {path}")
        return DataReference(self, path_on_datastore=target_path)

    def download(self, target_path: str, prefix: str | None = None, overwrite: bool = False,
                 show_progress: bool = True) -> int:
        """Copy the datastore's files (under ``prefix``) into ``target_path``."""
        count = 0
        for path in sorted(p for p in self.root.rglob("*") if p.is_file()):
            rel = path.relative_to(self.root).as_posix()
            if prefix and not rel.startswith(prefix):
                continue
            dest = Path(target_path) / rel
            if dest.exists() and not overwrite:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
            count += 1
        if show_progress:
            print(f"Downloaded {count} files")
        return count

    def path(self, path: str | None = None, data_reference_name: str | None = None
             ) -> DataReference:
        return DataReference(self, data_reference_name, path)

    def as_mount(self) -> DataReference:
        return DataReference(self, mode="mount")

    def as_download(self, path_on_compute: str | None = None) -> DataReference:
        return DataReference(self, mode="download", path_on_compute=path_on_compute)


__all__ = ["Datastore"]
