"""Cluster spec: a named pool of nodes on one backend, with a size, a priority and scale
settings (Batch AI ``cluster.json`` and AML ``provisioning_configuration`` both map here)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from batchyard.spec.base import SpecModel
from batchyard.spec.bytesize import MAX as MAX_SIZE
from batchyard.spec.bytesize import parse_size
from batchyard.spec.durations import parse_duration
from batchyard.spec.job import MAX_PIDS, MIN_PIDS, NAME_RE, check_env_names, stringify_env
from batchyard.spec.sizes import NodeSize, custom, lookup

MAX_NODES = 10000
DEFAULT_PIDS = 4096  # pids.max of a job on a node
DEFAULT_OUTPUT = 10 << 30  # limits.max_output of a job whose cluster names none
MAX_SECONDS = 10 * 365 * 86400.0
# A backend address: host, host:port, [v6]:port or scheme://host:port (ray://, auto), in
# printable ASCII; anything else cannot name a head.
ADDRESS_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)"
                        r"(?::(?P<port>\d{1,5}))?/?$")

# `az batchai cluster create -i`: its aliases and their images.
IMAGE_ALIASES = {"UbuntuLTS": "Canonical:UbuntuServer:16.04-LTS",
                 "UbuntuDSVM": "microsoft-ads:linux-data-science-vm-ubuntu:linuxdsvmubuntu"}
IMAGE_URN_RE = re.compile(r"^[\w.-]+:[\w.-]+:[\w.-]+(?::[\w.-]+)?$")

# sbatch options the slurm backend sets itself; --slurm-option may not override them.
OWN_OPTIONS = {"nodes", "ntasks-per-node", "ntasks", "job-name", "output", "error",
               "export", "requeue", "no-requeue", "comment", "partition", "input", "parsable",
               "chdir"}


class _Model(SpecModel):
    """extra="forbid"; no NUL byte in any text, no true/false for a number, finite floats."""


class Resources(_Model):
    cpus: int = Field(ge=1, le=100_000)
    gpus: int = Field(0, ge=0, le=10_000)
    memory_gb: float = Field(4.0, gt=0, le=1_000_000)


class ManualScale(_Model):
    target_node_count: int = Field(ge=0, le=MAX_NODES)
    node_deallocation_option: Literal["requeue", "terminate", "waitforjobcompletion"] = "requeue"


class AutoScale(_Model):
    min_nodes: int = Field(0, ge=0, le=MAX_NODES)
    max_nodes: int = Field(ge=1, le=MAX_NODES)
    initial_node_count: int = Field(0, ge=0, le=MAX_NODES)
    idle_seconds_before_scaledown: float = Field(1800, ge=0, le=MAX_SECONDS)

    @model_validator(mode="after")
    def _bounds(self) -> AutoScale:
        if self.min_nodes > self.max_nodes:
            raise ValueError("min_nodes must not exceed max_nodes")
        return self


class SetupTask(_Model):
    command: str = Field(description="Runs on every node when it joins (Batch AI setupTask).")
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        return stringify_env(value)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return check_env_names(value)


class SlurmSettings(_Model):
    """Where a Slurm-backed cluster's gangs go: a partition and the sbatch options a site
    asks for (account, QOS, constraints, anything else as ``options``)."""

    partition: str | None = Field(None, description="Slurm partition (default: Slurm's).")
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    options: dict[str, str] = Field(
        default_factory=dict, description="More sbatch options, e.g. {mem: 16G} for --mem=16G.")
    work_dir: str | None = Field(
        None, description="The node work dir on every Slurm node (default /tmp/batchyard-slurm)."
    )
    python: str | None = Field(
        None, description="The Python that has batchyard on the nodes (default: the server's).")

    @model_validator(mode="after")
    def _options(self) -> SlurmSettings:
        for key in self.options:
            bare = key.lstrip("-")
            if not bare or any(c.isspace() for c in bare) or "\n" in str(self.options[key]):
                raise ValueError(f"options: {key!r} is not an sbatch option")
            if bare in OWN_OPTIONS:
                raise ValueError(f"options: --{bare} is set by batchyard itself")
        for name in ("partition", "account", "qos", "constraint"):
            value = getattr(self, name)
            if value is not None and (not value.strip() or "\n" in value):
                raise ValueError(f"{name}: {value!r} is not a valid Slurm {name}")
        return self


class ClusterSpec(_Model):
    name: str = Field(pattern=NAME_RE)
    backend: Literal["local", "machines", "ray", "slurm"] = "local"
    vm_size: str | None = Field(None, description="Catalog size, e.g. Standard_NC6.")
    resources: Resources | None = Field(None, description="Explicit node resources instead.")
    vm_priority: Literal["dedicated", "lowpriority"] = "dedicated"
    manual: ManualScale | None = None
    autoscale: AutoScale | None = None
    setup_task: SetupTask | None = None
    address: str | None = Field(None, max_length=255,
                                description="Backend address (ray: the head).")
    ray_token_file: str | None = Field(
        None, max_length=4096,
        description="ray: file holding the Ray cluster's auth token (Ray's token "
        "authentication); the token itself is never stored or shown.",
    )
    provisioning_delay: float = Field(
        0.0, ge=0, le=3600, description="local: seconds a new node takes to join."
    )
    preemption_rate: float = Field(
        0.0, ge=0, le=3600,
        description="Chaos, lowpriority only: evictions per node-hour of running nodes, as a "
        "cloud would evict low-priority VMs (for tests and demos).",
    )
    preemption_grace: float = Field(
        30.0, ge=0, le=3600, description="Seconds an evicted node's ranks get to checkpoint."
    )
    slurm: SlurmSettings | None = Field(None, description="slurm: partition and sbatch options.")
    heartbeat_timeout: float = Field(
        30.0, ge=1, le=3600,
        description="machines: a node whose agent sends no heartbeat for this long is lost; "
        "any backend: a node launcher a server that took over (or restarted) does not hear "
        "from for this long is lost, and its job fails or is requeued.",
    )
    hang_timeout: float | None = Field(
        None, gt=0, le=7 * 24 * 3600,
        description="Default limits.hang_timeout of the cluster's jobs (seconds or '10m').")
    preflight: Literal["none", "network", "gpu", "all"] | None = Field(
        None, description="Default preflight of the cluster's multi-node jobs.")
    health_check_every: float | None = Field(
        None, gt=0, le=7 * 24 * 3600,
        description="local, machines: check idle nodes this often (seconds or '10m'): the "
        "work dir's free space, the GPUs, the server; a failing node becomes unusable with "
        "the measured reason.")
    health_check_passes: int = Field(
        3, ge=1, le=100,
        description="An unusable node returns to idle after passing this many health checks "
        "in a row (not one held after two failed pre-flights in a day).")
    auto_storage: bool = Field(
        False, description="Mount the workspace's default datastore in every job of the "
        "cluster at $AZ_BATCHAI_MOUNT_ROOT/autobfs and autoafs (Batch AI --use-auto-storage).")
    allow_root_jobs: bool = Field(
        False, description="Jobs may run as root on the nodes (with no capability, the host's "
        "/ read-only). Otherwise every job process runs as an unprivileged uid of its "
        "submitter (node/jobuser.py). Container jobs run as root in their image either way.")
    max_pids: int = Field(
        DEFAULT_PIDS, ge=MIN_PIDS, le=MAX_PIDS,
        description="Processes and threads one job may have at once on one node (a cgroup's "
        "pids.max); a job's limits.max_pids may only lower it.")
    max_output: int | None = Field(
        None, gt=0, le=MAX_SIZE,
        description="Default limits.max_output of the cluster's jobs ('10G'); None: "
        f"{DEFAULT_OUTPUT >> 30}G.")
    image: str | None = Field(
        None, max_length=255,
        description="Batch AI node image (" + ", ".join(IMAGE_ALIASES) + " or "
        "publisher:offer:sku:version), kept as a note: the nodes run their host's own OS.")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is None or value in IMAGE_ALIASES or IMAGE_URN_RE.match(value):
            return value
        raise ValueError(f"{value!r} is not a Batch AI image: use one of "
                         f"{', '.join(IMAGE_ALIASES)} or publisher:offer:sku:version")

    @field_validator("max_output", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else parse_size(value)

    @field_validator("hang_timeout", "health_check_every", mode="before")
    @classmethod
    def _hang_duration(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return value
        m = ADDRESS_RE.match(value)
        if not m or (m["port"] is not None and not 0 < int(m["port"]) < 65536):
            raise ValueError(f"{value!r} is not an address: use HOST, HOST:PORT or "
                             "ray://HOST:PORT")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> ClusterSpec:
        if self.vm_size and self.resources:
            raise ValueError("give vm_size or resources, not both")
        if self.vm_size:
            lookup(self.vm_size)
        if self.backend == "slurm" and self.autoscale:
            raise ValueError("autoscale: Slurm owns its nodes (a slurm cluster has the "
                             "partition's nodes); drop the autoscale settings")
        if self.slurm is not None and self.backend != "slurm":
            raise ValueError("slurm: settings for the slurm backend only")
        if self.manual and self.autoscale:
            raise ValueError("give manual or autoscale settings, not both")
        if self.health_check_every is not None and self.backend not in ("local", "machines"):
            raise ValueError(f"health_check_every: the nodes of a {self.backend} cluster "
                             "are not checked by batchyard (local and machines clusters)")
        if not self.manual and not self.autoscale:
            self.manual = ManualScale(target_node_count=1)
        return self

    def node_size(self) -> NodeSize:
        if self.vm_size:
            return lookup(self.vm_size)
        if self.resources:
            r = self.resources
            return custom(r.cpus, r.gpus, r.memory_gb)
        return lookup("Standard_D2_v2")

    @property
    def max_nodes(self) -> int:
        if self.autoscale:
            return self.autoscale.max_nodes
        assert self.manual is not None
        return self.manual.target_node_count

    @property
    def initial_nodes(self) -> int:
        if self.autoscale:
            return max(self.autoscale.initial_node_count, self.autoscale.min_nodes)
        assert self.manual is not None
        return self.manual.target_node_count
