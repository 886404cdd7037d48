"""azureml.core.workspace.Workspace: a batchyard workspace. Subscription and resource group are
accepted and recorded with it (nothing is created in Azure); ``write_config`` and
``from_config`` use the same files and search as Azure ML."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchyard import errors
from batchyard.compat.azureml._common import refuse
from batchyard.compat.azureml.exceptions import (
    ProjectSystemException,
    UserErrorException,
    WorkspaceException,
)
from batchyard.sdk.workspace import Workspace as _SdkWorkspace

if TYPE_CHECKING:
    from batchyard.compat.azureml.core.compute.amlcompute import AmlCompute
    from batchyard.compat.azureml.core.datastore import Datastore
    from batchyard.compat.azureml.core.experiment import Experiment

CONFIG_DIRS = (".azureml", "aml_config")
CONFIG_FILE = "config.json"


class Workspace:
    """``Workspace(subscription_id, resource_group, workspace_name)`` gets an existing one."""

    def __init__(self, subscription_id: str | None = None, resource_group: str | None = None,
                 workspace_name: str | None = None, auth: Any = None,
                 _location: str | None = None, _disable_service_check: bool = False,
                 **_ignored: Any) -> None:
        if not workspace_name:
            raise UserErrorException("workspace_name is required")
        from batchyard.compat.azureml.core.authentication import client_of

        self._sdk = _SdkWorkspace(workspace_name, client=client_of(auth))
        try:
            data = self._sdk.refresh()
        except errors.NotFound:
            raise ProjectSystemException(f"Workspace {workspace_name!r} not found on the "
                                         "batchyard server; create it with Workspace.create")\
                from None
        except errors.Forbidden as exc:  # no role there: as Azure, not accessible
            raise ProjectSystemException(exc.message) from None
        _check_recorded(data, subscription_id, resource_group)
        self._data = data

    @classmethod
    def _wrap(cls, sdk: _SdkWorkspace) -> Workspace:
        obj = cls.__new__(cls)
        obj._sdk = sdk
        obj._data = sdk.data
        return obj

    def __repr__(self) -> str:
        return (f"Workspace.create(name='{self.name}', subscription_id='{self.subscription_id}'"
                f", resource_group='{self.resource_group}')")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    # lifecycle ---------------------------------------------------------------------------------

    @staticmethod
    def create(name: str, auth: Any = None, subscription_id: str | None = None,
               resource_group: str | None = None, location: str | None = None,
               create_resource_group: bool = True, sku: str = "basic",
               friendly_name: str | None = None, storage_account: str | None = None,
               key_vault: str | None = None, app_insights: str | None = None,
               container_registry: str | None = None, default_cpu_compute_target: Any = None,
               default_gpu_compute_target: Any = None, exist_ok: bool = False,
               show_output: bool = True, **_ignored: Any) -> Workspace:
        """Create the workspace on the batchyard server. ``create_resource_group``, ``sku``
        and ``friendly_name`` have nothing to do here and are accepted."""
        refuse("Workspace.create", "batchyard creates no Azure resources; a workspace is a "
               "namespace on the batchyard server", storage_account=storage_account,
               key_vault=key_vault, app_insights=app_insights,
               container_registry=container_registry,
               default_cpu_compute_target=default_cpu_compute_target,
               default_gpu_compute_target=default_gpu_compute_target)
        from batchyard.compat.azureml.core.authentication import client_of

        try:
            sdk = _SdkWorkspace.create(name, location=location, subscription_id=subscription_id,
                                       resource_group=resource_group, exist_ok=exist_ok,
                                       client=client_of(auth))
        except errors.Conflict as exc:
            raise WorkspaceException(f"{exc.message}; use Workspace.get, or exist_ok=True")\
                from None
        except errors.UserError as exc:
            raise UserErrorException(exc.message) from None
        if show_output:
            print(f"Workspace {name} is ready on the batchyard server at {sdk.client.url}")
        return Workspace._wrap(sdk)

    @staticmethod
    def get(name: str, auth: Any = None, subscription_id: str | None = None,
            resource_group: str | None = None, **_ignored: Any) -> Workspace:
        return Workspace(subscription_id, resource_group, name, auth=auth)

    @staticmethod
    def list(subscription_id: str | None = None, auth: Any = None,
             resource_group: str | None = None) -> dict[str, list[Workspace]]:
        """Name -> [Workspace], filtered by the recorded subscription/resource group."""
        from batchyard.compat.azureml.core.authentication import client_of

        found: dict[str, list[Workspace]] = {}
        for sdk in _SdkWorkspace.list_all(client=client_of(auth)):
            data = sdk.data
            if subscription_id and data.get("subscription_id") not in (None, subscription_id):
                continue
            if resource_group and data.get("resource_group") not in (None, resource_group):
                continue
            found.setdefault(sdk.name, []).append(Workspace._wrap(sdk))
        return found

    def delete(self, delete_dependent_resources: bool = False, no_wait: bool = False) -> None:
        self._sdk.delete()

    # properties --------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._sdk.name

    @property
    def subscription_id(self) -> str | None:
        return self._data.get("subscription_id")

    @property
    def resource_group(self) -> str | None:
        return self._data.get("resource_group")

    @property
    def location(self) -> str | None:
        return self._data.get("location")

    @property
    def sdk(self) -> _SdkWorkspace:
        """The batchyard SDK workspace behind this one."""
        return self._sdk

    def get_details(self) -> dict[str, Any]:
        data = self._sdk.refresh()
        return {"id": f"batchyard://workspaces/{self.name}", "name": self.name,
                "location": data.get("location"), "subscriptionId": data.get("subscription_id"),
                "resourceGroup": data.get("resource_group"), "batchyardServer":
                self._sdk.client.url, "clusters": data.get("clusters", []),
                "experiments": data.get("experiments", [])}

    @property
    def compute_targets(self) -> dict[str, AmlCompute]:
        from batchyard.compat.azureml.core.compute.amlcompute import AmlCompute

        return {c.name: AmlCompute._wrap(self, c.data) for c in self._sdk.clusters()}

    @property
    def experiments(self) -> dict[str, Experiment]:
        from batchyard.compat.azureml.core.experiment import Experiment

        return {e.name: Experiment._wrap(self, e.name) for e in self._sdk.experiments()}

    @property
    def datastores(self) -> dict[str, Datastore]:
        from batchyard.compat.azureml.core.datastore import Datastore

        default = self.get_default_datastore()
        return {default.name: default, **{d.name: d for d in Datastore._registered_list(self)}}

    def get_default_datastore(self) -> Datastore:
        from batchyard.compat.azureml.core.datastore import Datastore

        return Datastore.get_default(self)

    # config files ------------------------------------------------------------------------------

    def write_config(self, path: str | None = None, file_name: str | None = None) -> None:
        """Write ``.azureml/config.json`` (and the older ``aml_config/config.json`` of the
        seeds) under ``path`` (default: the current directory)."""
        base = Path(path or ".")
        body = {"subscription_id": self.subscription_id, "resource_group": self.resource_group,
                "workspace_name": self.name}
        for folder in CONFIG_DIRS:
            target = base / folder / (file_name or CONFIG_FILE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(body, indent=4) + "\n")

    @staticmethod
    def from_config(path: str | None = None, auth: Any = None, _logger: Any = None,
                    _file_name: str | None = None) -> Workspace:
        """Find a config file as Azure ML did (``path`` itself when it is a file; else in
        ``path`` or the current directory and then each parent: ``.azureml/config.json``,
        ``aml_config/config.json``, ``config.json``) and get its workspace."""
        found = find_config(path, _file_name)
        print(f"Found the config file in: {found}")
        try:
            config = json.loads(found.read_text())
        except ValueError as exc:
            raise UserErrorException(f"{found} is not valid JSON: {exc}") from None
        name = config.get("workspace_name")
        if not name:
            raise UserErrorException(f"{found} names no workspace_name")
        return Workspace(config.get("subscription_id"), config.get("resource_group"), name,
                         auth=auth)


def find_config(path: str | None = None, file_name: str | None = None) -> Path:
    name = file_name or CONFIG_FILE
    start = Path(path or os.getcwd()).expanduser()
    if start.is_file():
        return start
    start = start.resolve()
    for folder in (start, *start.parents):
        for candidate in (folder / CONFIG_DIRS[0] / name, folder / CONFIG_DIRS[1] / name,
                          folder / name):
            if candidate.is_file():
                return candidate
    raise UserErrorException(
        f"We could not find {name} in: {start} or in its parent directories. Please provide "
        f"the full path to the config file or ensure that {name} exists in the parent "
        "directories (ws.write_config() writes one).")


def _check_recorded(data: dict[str, Any], subscription_id: str | None,
                    resource_group: str | None) -> None:
    for key, given in (("subscription_id", subscription_id),
                       ("resource_group", resource_group)):
        recorded = data.get(key)
        if given and recorded and given != recorded:
            raise WorkspaceException(
                f"workspace {data.get('name')!r} was created with {key} {recorded!r}, not "
                f"{given!r}")

