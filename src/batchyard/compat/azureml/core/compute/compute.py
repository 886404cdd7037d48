"""azureml.core.compute.ComputeTarget: a batchyard cluster, looked up by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchyard import errors
from batchyard.compat.azureml.exceptions import ComputeTargetException, UnsupportedParameterError
from batchyard.sdk.cluster import Cluster

if TYPE_CHECKING:
    from batchyard.compat.azureml.core.workspace import Workspace


def fetch(workspace: Workspace, name: str) -> dict[str, Any]:
    try:
        return Cluster.get(workspace.sdk, name).data
    except errors.NotFound:
        raise ComputeTargetException(
            f"ComputeTargetNotFound: Compute Target with name {name} not found in provided "
            f"workspace {workspace.name}") from None


class ComputeTarget:
    """``ComputeTarget(workspace=ws, name=...)`` returns the existing target (an
    :class:`AmlCompute`), or raises ComputeTargetException when there is none."""

    _compute_type = "Compute"
    _prefetched: dict[str, Any] | None = None

    def __new__(cls, workspace: Workspace | None = None, name: str | None = None) -> Any:
        if workspace is not None and name is not None and cls is ComputeTarget:
            from batchyard.compat.azureml.core.compute.amlcompute import AmlCompute

            data = fetch(workspace, name)
            obj = object.__new__(AmlCompute)
            obj._prefetched = data
            return obj
        return object.__new__(cls)

    def __init__(self, workspace: Workspace | None = None, name: str | None = None) -> None:
        if workspace is None or name is None:
            raise ComputeTargetException("ComputeTarget needs workspace= and name=")
        self.workspace = workspace
        self.name = name
        self._data: dict[str, Any] = self._prefetched if self._prefetched is not None else \
            fetch(workspace, name)

    @property
    def type(self) -> str:
        return self._compute_type

    @property
    def cluster(self) -> Cluster:
        """The batchyard SDK cluster behind this target."""
        return Cluster(self.workspace.sdk, self.name, data=self._data)

    @staticmethod
    def create(workspace: Workspace, name: str, provisioning_configuration: Any) -> Any:
        """Create a target from ``AmlCompute.provisioning_configuration(...)``."""
        create = getattr(provisioning_configuration, "create_target", None)
        if create is None:
            raise ComputeTargetException(
                "provisioning_configuration: give AmlCompute.provisioning_configuration(...)")
        return create(workspace, name)

    @staticmethod
    def attach(workspace: Workspace, name: str, attach_configuration: Any) -> Any:
        raise UnsupportedParameterError(
            "attach_configuration", "attaching VMs, HDInsight or Databricks is not supported; "
            "run `batchyard cluster create` for machines batchyard manages", "ComputeTarget")

    @staticmethod
    def list(workspace: Workspace) -> list[Any]:
        return list(workspace.compute_targets.values())

    def delete(self) -> None:
        try:
            self.cluster.delete()
        except errors.UserError as exc:
            raise ComputeTargetException(exc.message) from None

    def detach(self) -> None:
        raise UnsupportedParameterError("detach", "clusters are deleted, not detached",
                                        "ComputeTarget")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(workspace={self.workspace!r}, name={self.name}, "
                f"type={self.type})")
