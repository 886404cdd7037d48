"""Workspaces from Python: the namespace for clusters, experiments and jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchyard import errors
from batchyard.client.http import Client
from batchyard.sdk._client import default_client

if TYPE_CHECKING:
    from batchyard.sdk.cluster import Cluster
    from batchyard.sdk.experiment import Experiment
    from batchyard.sdk.job import Job


class Workspace:
    """A workspace on the server (``Workspace()`` is the ``default`` one)."""

    def __init__(self, name: str = "default", *, client: Client | None = None,
                 data: dict[str, Any] | None = None) -> None:
        self.name = name
        self._client = client
        self.data: dict[str, Any] = data or {}

    def __repr__(self) -> str:
        return f"Workspace({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def client(self) -> Client:
        return self._client or default_client()

    @classmethod
    def create(cls, name: str, *, location: str | None = None,
               subscription_id: str | None = None, resource_group: str | None = None,
               exist_ok: bool = False, client: Client | None = None) -> Workspace:
        """Create a workspace; subscription and resource group are recorded as given."""
        ws = cls(name, client=client)
        ws.data = ws.client.post("/workspaces", {
            "name": name, "location": location, "subscription_id": subscription_id,
            "resource_group": resource_group, "exist_ok": exist_ok})
        return ws

    @classmethod
    def get(cls, name: str = "default", *, client: Client | None = None) -> Workspace:
        """An existing workspace (NotFound if there is none of that name)."""
        ws = cls(name, client=client)
        ws.refresh()
        return ws

    @classmethod
    def list_all(cls, *, client: Client | None = None) -> list[Workspace]:
        c = client or default_client()
        return [cls(w["name"], client=client, data=w) for w in c.get("/workspaces")]

    def refresh(self) -> dict[str, Any]:
        self.data = self.client.get(f"/workspaces/{self.name}")
        return self.data

    @property
    def location(self) -> str | None:
        return self._field("location")

    @property
    def subscription_id(self) -> str | None:
        return self._field("subscription_id")

    @property
    def resource_group(self) -> str | None:
        return self._field("resource_group")

    def _field(self, key: str) -> str | None:
        if key not in self.data:
            self.refresh()
        value = self.data.get(key)
        return None if value is None else str(value)

    def delete(self) -> None:
        self.client.delete(f"/workspaces/{self.name}")

    # clusters ----------------------------------------------------------------------------------

    def clusters(self) -> list[Cluster]:
        from batchyard.sdk.cluster import Cluster

        rows = self.client.get(f"/workspaces/{self.name}/clusters")
        return [Cluster(self, row["name"], data=row) for row in rows]

    def cluster(self, name: str) -> Cluster:
        from batchyard.sdk.cluster import Cluster

        return Cluster.get(self, name)

    def create_cluster(self, name: str, **settings: Any) -> Cluster:
        """See :meth:`batchyard.sdk.cluster.Cluster.create` for the settings."""
        from batchyard.sdk.cluster import Cluster

        return Cluster.create(self, name, **settings)

    # experiments and jobs ----------------------------------------------------------------------

    def experiments(self) -> list[Experiment]:
        from batchyard.sdk.experiment import Experiment

        rows = self.client.get(f"/workspaces/{self.name}/experiments")
        return [Experiment(self, row["name"], data=row) for row in rows]

    def experiment(self, name: str, *, create: bool = True) -> Experiment:
        """The experiment of that name (created when missing unless ``create=False``)."""
        from batchyard.sdk.experiment import Experiment

        if create:
            return Experiment.create(self, name, exist_ok=True)
        exp = Experiment(self, name)
        exp.refresh()
        return exp

    def jobs(self, experiment: str | None = None, state: str | None = None,
             cluster: str | None = None) -> list[Job]:
        from batchyard.sdk.job import Job

        rows = self.client.get(f"/workspaces/{self.name}/jobs", experiment=experiment,
                               state=state, cluster=cluster)
        return [Job(self, row["experiment"], row["name"], data=row) for row in rows]

    def exists(self) -> bool:
        try:
            self.refresh()
        except errors.NotFound:
            return False
        return True
