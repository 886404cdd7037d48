"""azureml.core.compute.AmlCompute: an autoscaling batchyard cluster. It starts with
``min_nodes`` nodes; batchyard's scheduler adds nodes (up to ``max_nodes``) when a job waits
for them and releases nodes idle for ``idle_seconds_before_scaledown``, as AML Compute did."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from batchyard import errors
from batchyard.compat.azureml._common import iso, refuse
from batchyard.compat.azureml.core.compute.compute import ComputeTarget
from batchyard.compat.azureml.exceptions import ComputeTargetException, UnsupportedParameterError
from batchyard.sdk.cluster import Cluster

if TYPE_CHECKING:
    from batchyard.compat.azureml.core.workspace import Workspace

DEFAULT_MAX_NODES = 4
DEFAULT_IDLE_SECONDS = 120


class ScaleSettings:
    def __init__(self, minimum_node_count: int, maximum_node_count: int,
                 idle_seconds_before_scaledown: float | None) -> None:
        self.minimum_node_count = minimum_node_count
        self.maximum_node_count = maximum_node_count
        self.idle_seconds_before_scaledown = idle_seconds_before_scaledown

    def serialize(self) -> dict[str, Any]:
        idle = self.idle_seconds_before_scaledown
        return {"minNodeCount": self.minimum_node_count, "maxNodeCount": self.maximum_node_count,
                "nodeIdleTimeBeforeScaleDown": None if idle is None else f"PT{int(idle)}S"}


class AmlComputeNodeStateCounts:
    def __init__(self, counts: dict[str, int]) -> None:
        self.idle_node_count = counts.get("idle", 0)
        self.leaving_node_count = counts.get("leaving", 0)
        self.preempted_node_count = counts.get("preempted", 0)
        self.preparing_node_count = counts.get("preparing", 0)
        self.running_node_count = counts.get("running", 0)
        self.unusable_node_count = counts.get("unusable", 0)

    def serialize(self) -> dict[str, int]:
        return {"idleNodeCount": self.idle_node_count,
                "leavingNodeCount": self.leaving_node_count,
                "preemptedNodeCount": self.preempted_node_count,
                "preparingNodeCount": self.preparing_node_count,
                "runningNodeCount": self.running_node_count,
                "unusableNodeCount": self.unusable_node_count}


def scale_settings(data: dict[str, Any]) -> ScaleSettings:
    scale = data.get("scale") or {}
    auto = scale.get("autoscale")
    if auto:
        return ScaleSettings(int(auto.get("min_nodes", 0)), int(auto["max_nodes"]),
                             auto.get("idle_seconds_before_scaledown"))
    target = int((scale.get("manual") or {}).get("target_node_count", data.get("target_nodes", 0)))
    return ScaleSettings(target, target, None)


class AmlComputeStatus:
    """The state of a target as ``compute_target.status`` / ``get_status()`` gave it."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.allocation_state = "Resizing" if data.get("allocation_state") == "resizing" \
            else "Steady"
        self.allocation_state_transition_time = None
        self.creation_time = iso(data.get("created_at"))
        self.current_node_count = int(data.get("current_nodes", 0))
        self.errors = None
        self.modified_time = self.creation_time
        self.node_state_counts = AmlComputeNodeStateCounts(data.get("node_counts") or {})
        self.provisioning_state = "Succeeded"
        self.provisioning_state_transition_time = self.creation_time
        self.scale_settings = scale_settings(data)
        self.target_node_count = int(data.get("target_nodes", 0))
        priority = data.get("vm_priority") or "dedicated"
        self.vm_priority = "LowPriority" if priority == "lowpriority" else "Dedicated"
        self.vm_size = str(data.get("vm_size") or (data.get("size") or {}).get("name") or "")

    def serialize(self) -> dict[str, Any]:
        return {"currentNodeCount": self.current_node_count,
                "targetNodeCount": self.target_node_count,
                "nodeStateCounts": self.node_state_counts.serialize(),
                "allocationState": self.allocation_state,
                "allocationStateTransitionTime": self.allocation_state_transition_time,
                "errors": self.errors, "creationTime": self.creation_time,
                "modifiedTime": self.modified_time,
                "provisioningState": self.provisioning_state,
                "provisioningStateTransitionTime": self.provisioning_state_transition_time,
                "scaleSettings": self.scale_settings.serialize(),
                "vmPriority": self.vm_priority, "vmSize": self.vm_size}


class AmlComputeProvisioningConfiguration:
    def __init__(self, vm_size: str, vm_priority: str, min_nodes: int, max_nodes: int,
                 idle_seconds_before_scaledown: float, tags: dict[str, str] | None = None,
                 description: str | None = None, location: str | None = None) -> None:
        self.vm_size = vm_size
        self.vm_priority = vm_priority
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.idle_seconds_before_scaledown = idle_seconds_before_scaledown
        self.tags = tags or {}  # kept on this object only
        self.description = description
        self.location = location

    def validate_configuration(self) -> None:
        if self.vm_priority not in ("dedicated", "lowpriority"):
            raise ComputeTargetException("vm_priority: use 'dedicated' or 'lowpriority'")
        if self.min_nodes < 0 or self.max_nodes < 1 or self.min_nodes > self.max_nodes:
            raise ComputeTargetException("min_nodes/max_nodes: need 0 <= min_nodes <= max_nodes"
                                         " and max_nodes >= 1")

    def create_target(self, workspace: Workspace, name: str) -> AmlCompute:
        self.validate_configuration()
        from batchyard.sdk.cluster import default_backend

        try:
            if default_backend() == "slurm":  # $BATCHYARD_BACKEND: a Slurm partition's nodes
                print(f"Creating {name!r} on Slurm: its nodes are the partition's (vm_size "
                      f"{self.vm_size or 'default'} and max_nodes {self.max_nodes} are Slurm's "
                      "business there)")
                cluster = Cluster.create(workspace.sdk, name, vm_priority=self.vm_priority,
                                         backend="slurm")
            else:
                cluster = Cluster.create(
                    workspace.sdk, name, vm_size=self.vm_size or None,
                    vm_priority=self.vm_priority, min_nodes=self.min_nodes,
                    max_nodes=self.max_nodes, initial_nodes=self.min_nodes,
                    idle_seconds_before_scaledown=self.idle_seconds_before_scaledown)
        except errors.UserError as exc:
            raise ComputeTargetException(exc.message) from None
        target = AmlCompute._wrap(workspace, cluster.data)
        target._provisioning = True
        return target


class AmlCompute(ComputeTarget):
    _compute_type = "AmlCompute"
    _provisioning = False

    @staticmethod
    def provisioning_configuration(
            vm_size: str = "", vm_priority: str = "dedicated", min_nodes: int = 0,
            max_nodes: int | None = None, idle_seconds_before_scaledown: float | None = None,
            admin_username: str | None = None, admin_user_password: str | None = None,
            admin_user_ssh_key: str | None = None, vnet_resourcegroup_name: str | None = None,
            vnet_name: str | None = None, subnet_name: str | None = None,
            tags: dict[str, str] | None = None, description: str | None = None,
            remote_login_port_public_access: str = "NotSpecified",
            identity_type: str | None = None, identity_id: list[str] | None = None,
            location: str | None = None) -> AmlComputeProvisioningConfiguration:
        refuse("AmlCompute.provisioning_configuration", "batchyard nodes have no ssh users; "
               "run commands on a node with `batchyard cluster node exec`",
               admin_username=admin_username, admin_user_password=admin_user_password,
               admin_user_ssh_key=admin_user_ssh_key)
        refuse("AmlCompute.provisioning_configuration", "there are no Azure virtual networks "
               "or managed identities here", vnet_resourcegroup_name=vnet_resourcegroup_name,
               vnet_name=vnet_name, subnet_name=subnet_name, identity_type=identity_type,
               identity_id=identity_id)
        if remote_login_port_public_access not in ("NotSpecified", "Disabled"):
            raise UnsupportedParameterError("remote_login_port_public_access",
                                            "nodes have no ssh port",
                                            "AmlCompute.provisioning_configuration")
        config = AmlComputeProvisioningConfiguration(
            vm_size, vm_priority, min_nodes,
            DEFAULT_MAX_NODES if max_nodes is None else max_nodes,
            DEFAULT_IDLE_SECONDS if idle_seconds_before_scaledown is None
            else idle_seconds_before_scaledown, tags, description, location)
        config.validate_configuration()
        return config

    @classmethod
    def _wrap(cls, workspace: Workspace, data: dict[str, Any]) -> AmlCompute:
        obj = object.__new__(cls)
        obj.workspace = workspace
        obj.name = str(data["name"])
        obj._data = data
        return obj

    def refresh(self) -> dict[str, Any]:
        try:
            self._data = self.cluster.refresh()
        except errors.NotFound:
            raise ComputeTargetException(f"compute target {self.name} no longer exists") \
                from None
        return self._data

    @property
    def provisioning_state(self) -> str:
        return "Creating" if self._provisioning else "Succeeded"

    @property
    def vm_size(self) -> str:
        return AmlComputeStatus(self._data).vm_size

    @property
    def vm_priority(self) -> str:
        return str(self._data.get("vm_priority") or "dedicated")

    @property
    def scale_settings(self) -> ScaleSettings:
        return scale_settings(self._data)

    @property
    def status(self) -> AmlComputeStatus:
        return self.get_status()

    def get_status(self) -> AmlComputeStatus:
        return AmlComputeStatus(self.refresh())

    def wait_for_completion(self, show_output: bool = False, min_node_count: int | None = None,
                            timeout_in_minutes: float = 20,
                            is_delete_operation: bool = False) -> None:
        """Wait until the target is steady with ``min_node_count`` (default: its minimum)
        nodes ready, printing the provisioning state like AML did."""
        if show_output:
            print(self.provisioning_state, flush=True)
        wanted = self.scale_settings.minimum_node_count if min_node_count is None \
            else min_node_count
        deadline = time.monotonic() + timeout_in_minutes * 60
        while True:
            status = self.get_status()
            counts = status.node_state_counts
            if (status.allocation_state == "Steady" and counts.preparing_node_count == 0
                    and counts.idle_node_count + counts.running_node_count >= wanted):
                break
            if time.monotonic() > deadline:
                raise ComputeTargetException(
                    f"compute target {self.name} not ready after {timeout_in_minutes:g} "
                    f"minutes: {counts.serialize()}")
            if show_output:
                sys.stdout.write(".")
                sys.stdout.flush()
            time.sleep(0.5)
        self._provisioning = False
        if show_output:
            print("Succeeded")
            print("AmlCompute wait for completion finished\n")
            print("Minimum number of nodes requested have been provisioned", flush=True)

    def list_nodes(self) -> list[dict[str, Any]]:
        return [{"nodeId": n["name"], "port": None, "privateIpAddress": n.get("address"),
                 "publicIpAddress": None, "nodeState": n.get("state"),
                 "runId": n.get("job_id")} for n in self.cluster.nodes()]

    def update(self, min_nodes: int | None = None, max_nodes: int | None = None,
               idle_seconds_before_scaledown: float | None = None) -> None:
        raise UnsupportedParameterError(
            ["min_nodes", "max_nodes", "idle_seconds_before_scaledown"],
            "batchyard cannot change the scale settings of an existing cluster yet; delete it "
            "and create it again", "AmlCompute.update")

    def serialize(self) -> dict[str, Any]:
        return {"id": f"batchyard://workspaces/{self.workspace.name}/clusters/{self.name}",
                "name": self.name, "location": self.workspace.location, "tags": None,
                "properties": {"computeType": "AmlCompute",
                               "provisioningState": self.provisioning_state,
                               "status": AmlComputeStatus(self._data).serialize()}}
