"""azureml.core.datastore.Datastore: the workspace's default datastore is a directory that
batchyard keeps (``$BATCHYARD_DATA_ROOT/datastores/<workspace>/workspaceblobstore``, on the
machine of the local server). Azure Blob containers (and file shares, kept in a blob container
of the share's name: batchyard speaks no Azure Files protocol) are registered on the server
as ``batchyard datastore register`` does (core/_registered.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from batchyard.compat.azureml.core import _registered
from batchyard.compat.azureml.data.data_reference import DataReference
from batchyard.compat.azureml.exceptions import UnsupportedParameterError, UserErrorException
from batchyard.config import data_root

DEFAULT_NAME = "workspaceblobstore"
_FILE_URL = ".file."


class Datastore:
    """The default datastore (a local directory), or one registered on the server."""

    def __init__(self, workspace: Any, name: str | None = None) -> None:
        self.workspace = workspace
        self.name = name or DEFAULT_NAME
        self.container_name: str | None = None
        self.account_name: str | None = None
        self.endpoint: str | None = None
        self.protocol: str | None = None
        self._registered = False
        data = _registered.view(workspace, self.name)
        if data is not None:  # the default too, when registered (e.g. on Azure Blob)
            self._take(data)
            return
        if self.name != DEFAULT_NAME:
            raise UserErrorException(f"datastore {self.name!r} not found in workspace "
                                     f"{workspace.name!r}")
        self.datastore_type = "Local"
        self.root = data_root() / "datastores" / workspace.name / self.name
        self.root.mkdir(parents=True, exist_ok=True)

    def _take(self, data: dict[str, Any]) -> None:
        self._registered = True
        kind = data.get("kind")
        self.root = Path(data["path"]) if kind == "local" and data.get("path") else None
        self.container_name = data.get("container") or data.get("bucket")
        self.account_name = data.get("account_name")
        self.endpoint = data.get("endpoint")
        self.protocol = (self.endpoint or "https").split("://", 1)[0] if self.endpoint else None
        shares = [u for u in data.get("maps_url") or [] if _FILE_URL in u]
        self.datastore_type = {"azure_blob": "AzureFile" if shares else "AzureBlob",
                               "s3": "S3", "local": "Local"}.get(str(kind), str(kind))

    def __repr__(self) -> str:
        if self._registered:
            return (f"Datastore(name={self.name!r}, type={self.datastore_type!r}, "
                    f"account={self.account_name!r}, container={self.container_name!r})")
        return f"Datastore(name={self.name!r}, root={str(self.root)!r})"

    @staticmethod
    def get(workspace: Any, datastore_name: str) -> Datastore:
        return Datastore(workspace, datastore_name)

    @staticmethod
    def get_default(workspace: Any) -> Datastore:
        return Datastore(workspace, DEFAULT_NAME)

    @staticmethod
    def _registered_list(workspace: Any) -> list[Datastore]:
        out = []
        for data in _registered.list_views(workspace):
            store = Datastore.__new__(Datastore)
            store.workspace, store.name = workspace, data["name"]
            store._take(data)
            out.append(store)
        return out

    @staticmethod
    def register_azure_blob_container(
            workspace: Any, datastore_name: str, container_name: str, account_name: str,
            sas_token: str | None = None, account_key: str | None = None,
            protocol: str | None = None, endpoint: str | None = None, overwrite: bool = False,
            create_if_not_exists: bool = False, skip_validation: bool = False,
            blob_cache_timeout: int | None = None, grant_workspace_access: bool = False,
            subscription_id: str | None = None, resource_group: str | None = None
    ) -> Datastore:
        """Register an Azure Blob container as a server datastore. ``endpoint`` is Azure
        ML's storage suffix (``core.windows.net``) or, for an emulator such as Azurite, the
        account URL itself."""
        _registered.register(workspace, {
            "name": datastore_name, "kind": "azure_blob", "account_name": account_name,
            "container": container_name, "account_key": account_key, "sas_token": sas_token,
            "endpoint": _registered.account_url(account_name, "blob", protocol, endpoint),
        }, overwrite=overwrite, create=create_if_not_exists, validate=not skip_validation)
        return Datastore(workspace, datastore_name)

    @staticmethod
    def register_azure_file_share(
            workspace: Any, datastore_name: str, file_share_name: str, account_name: str,
            sas_token: str | None = None, account_key: str | None = None,
            protocol: str | None = None, endpoint: str | None = None, overwrite: bool = False,
            create_if_not_exists: bool = False, skip_validation: bool = False
    ) -> Datastore:
        """Register an Azure file share. batchyard has no Azure Files client: the share's
        files are kept in the blob container of the share's name in the same account, and
        the datastore stands for the share's URL (Batch AI ``azureFileShares`` with that URL
        mount it)."""
        share_url = f"{_registered.account_url(account_name, 'file', protocol, None)}/" \
            f"{file_share_name}"
        print(f"Datastore {datastore_name}: the file share {share_url} is kept in the blob "
              f"container {file_share_name!r} of account {account_name!r} (batchyard speaks "
              "no Azure Files protocol)")
        _registered.register(workspace, {
            "name": datastore_name, "kind": "azure_blob", "account_name": account_name,
            "container": file_share_name, "account_key": account_key, "sas_token": sas_token,
            "endpoint": _registered.account_url(account_name, "blob", protocol, endpoint),
            "maps_url": [share_url],
        }, overwrite=overwrite, create=create_if_not_exists, validate=not skip_validation)
        return Datastore(workspace, datastore_name)

    def unregister(self) -> None:
        """Forget a registered datastore (its data stays where it is)."""
        if not self._registered:
            raise UserErrorException(f"the default directory datastore {self.name!r} is "
                                     "not registered")
        _registered.unregister(self.workspace, self.name)

    def _remote(self) -> bool:
        return self._registered and self.root is None

    def _target(self, target_path: str | None) -> Path:
        target = (self.root / (target_path or "")).resolve()
        if target != self.root.resolve() and self.root.resolve() not in target.parents:
            raise UserErrorException(f"target_path {target_path!r} leaves the datastore")
        return target

    def upload(self, src_dir: str, target_path: str | None = None, overwrite: bool = False,
               show_progress: bool = True) -> DataReference:
        """Copy a directory tree into the datastore."""
        source = Path(src_dir)
        if self._remote():
            files = [(p.relative_to(source).as_posix(), p)
                     for p in sorted(source.rglob("*")) if p.is_file()]
            _registered.upload(self.workspace, self.name, files, target_path, overwrite,
                               show_progress)
            return DataReference(self, path_on_datastore=target_path)
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
        if self._remote():
            pairs = [((Path(f).relative_to(relative_root) if relative_root
                       else Path(Path(f).name)).as_posix(), Path(f)) for f in files]
            _registered.upload(self.workspace, self.name, pairs, target_path, overwrite,
                               show_progress)
            return DataReference(self, path_on_datastore=target_path)
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
        if self._remote():
            return _registered.download(self.workspace, self.name, target_path, prefix,
                                        overwrite, show_progress)
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
        self._local_only("path")
        return DataReference(self, data_reference_name, path)

    def as_mount(self) -> DataReference:
        self._local_only("as_mount")
        return DataReference(self, mode="mount")

    def as_download(self, path_on_compute: str | None = None) -> DataReference:
        self._local_only("as_download")
        return DataReference(self, mode="download", path_on_compute=path_on_compute)

    def _local_only(self, what: str) -> None:
        if self._remote():
            raise UnsupportedParameterError(
                what, f"data references into {self.datastore_type} datastore {self.name!r} "
                "are not mapped to job inputs yet; give the job an input with path "
                f"datastore://{self.name}/<path> (mode download or ro_mount) instead",
                "Datastore")



__all__ = ["Datastore"]
