"""The native job spec: the one validated model every job format becomes (DESIGN §3.1)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from batchyard.spec.arrays import Dependency, parse_array
from batchyard.spec.base import SpecModel
from batchyard.spec.bytesize import MAX as MAX_SIZE
from batchyard.spec.bytesize import parse_size
from batchyard.spec.checkpoint import DEFAULT_SIGNAL, parse_signal
from batchyard.spec.containers import check_host, check_image, registry_of, same_registry, shm_bytes
from batchyard.spec.durations import parse_duration
from batchyard.spec.mpi import MpiSettings
from batchyard.spec.oslimits import check_launchable

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ENV_ID_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_DESCRIPTION = 64 * 1024  # characters
MAX_WALL_CLOCK = 10 * 365 * 86400.0  # seconds (timers take no more)
MAX_PROCESSES = 10000 * 1024  # nodes x processes per node, at most
MIN_PIDS, MAX_PIDS = 16, 4_194_304  # a cgroup's pids.max (the kernel's pid_max at most)
EXIT_CODE = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]

Priority = Literal["low", "normal", "high"]
PRIORITY_ORDER: dict[str, int] = {"low": 0, "normal": 1, "high": 2}

Command = Annotated[
    str | list[str],
    Field(
        description="A shell command line (run with bash -c, so $VARS expand) or an argv list "
        "(run as is, no shell)."
    ),
]


class _Model(SpecModel):
    """extra="forbid"; no NUL byte in any text, no true/false for a number, finite floats."""


class Distribution(_Model):
    """How the gang's processes are laid out and which launcher conventions they get."""

    type: Literal["pytorch", "mpi", "tensorflow", "custom"] = Field(
        "pytorch",
        description="pytorch: every rank runs the command with torchrun-compatible env; "
        "mpi: node 0 runs mpirun over all nodes; tensorflow: ranks get TF_CONFIG roles; "
        "custom: the command runs once, on the master node.",
    )
    processes_per_node: int = Field(1, ge=1, le=1024, description="Ranks started on each node.")
    process_count: int | None = Field(
        None,
        ge=1,
        le=MAX_PROCESSES,
        description="Total ranks (mpi and tensorflow; Batch AI processCount, or workers + "
        "parameter servers when they do not fill every node's slots). Defaults to "
        "nodes x processes_per_node.",
    )
    backend: Literal["auto", "gloo", "nccl", "mpi"] = Field(
        "auto", description="torch.distributed backend hint: auto picks nccl on GPUs, else gloo."
    )
    worker_count: int | None = Field(
        None, ge=1, le=MAX_PROCESSES,
        description="tensorflow: worker tasks (default: all ranks but the chief).",
    )
    parameter_server_count: int | None = Field(
        None, ge=0, le=MAX_PROCESSES, description="tensorflow: parameter-server tasks."
    )
    role_commands: dict[Literal["chief", "worker", "ps"], Command] = Field(
        default_factory=dict,
        description="tensorflow: a different command per task type (Batch AI's master/worker/"
        "parameterServer command-line args).",
    )
    mpirun_args: list[str] = Field(
        default_factory=list, description="mpi: extra arguments passed to mpirun."
    )


class OutputSpec(_Model):
    path_prefix: str | None = Field(
        None,
        description="Directory under which the output is created (Batch AI pathPrefix); it "
        "may start with one of Batch AI's path variables ($AZ_BATCHAI_JOB_MOUNT_ROOT, "
        "$AZ_BATCHAI_JOB_TEMP, ...), expanded on the node; defaults to the attempt's "
        "outputs/ directory.",
    )
    path_suffix: str | None = Field(None, description="Sub-path appended (Batch AI pathSuffix).")

    @field_validator("path_prefix")
    @classmethod
    def _node_path(cls, value: str | None) -> str | None:
        return value if value is None else check_node_path(value)
    datastore: str | None = Field(None, description="Datastore to upload the output to "
                                  "(under <experiment>/<job>/<id>/ unless path is given).")
    path: str | None = Field(None, description="Destination in storage: datastore://NAME/path, "
                             "azureml://datastores/NAME/paths/path, az://container/path or "
                             "s3://bucket/path.")
    mode: Literal["upload", "rw_mount"] = Field("upload", description="upload: at the end (and "
                                                "synced periodically); rw_mount: a read-write "
                                                "FUSE mount of the destination (rclone), "
                                                "uploaded where FUSE is missing.")


class InputSpec(_Model):
    path: str = Field(description="Local path, datastore path or URL of the input.")
    mode: Literal["download", "ro_mount", "direct"] = Field(
        "direct", description="download: copied before preparation; ro_mount: a read-only FUSE "
        "mount (rclone), downloaded where FUSE is missing; direct: the URL is passed.")


class MountSpec(_Model):
    """A storage volume reachable at ``$AZ_BATCHAI_JOB_MOUNT_ROOT/<relative_path>``."""

    kind: Literal["local", "azure_blob", "azure_files", "file_server", "unmanaged"] = "local"
    relative_path: str = Field(pattern=r"^[^/].*", description="Mount point under the mount root.")
    source: str = Field(
        "", description="local: a directory; azure_blob: account/container; file: share URL; "
        "file_server: host:/export (NFS)."
    )
    account_name: str | None = None
    account_key: str | None = Field(None, description="Secret; never shown back.")
    mount_command: str | None = Field(None, description="unmanaged: command that mounts it.")
    mount_options: str | None = None

    @field_validator("source")
    @classmethod
    def _nfs_source(cls, value: str, info: Any) -> str:
        if info.data.get("kind") == "file_server" and not _NFS_SOURCE.match(value):
            raise ValueError(f"a file_server (NFS) mount needs host:/export, not {value!r}")
        return value


_NFS_SOURCE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):/\S*$")


class Limits(_Model):
    max_wall_clock: float | None = Field(
        None, le=MAX_WALL_CLOCK,
        description="Seconds, or '90m', '1h30m', 'd.hh:mm:ss'. Ranks are stopped after it.",
    )
    max_retries: int = Field(0, ge=0, le=100, description="Re-runs after retryable failures.")
    grace_period: float = Field(
        30.0, ge=0, le=3600, description="Seconds between SIGTERM and SIGKILL on stop."
    )
    retry_exit_codes: list[EXIT_CODE] = Field(
        default_factory=list, description="Exit codes the user marks retryable."
    )
    hang_timeout: float | None = Field(
        None, gt=0, le=MAX_WALL_CLOCK,
        description="Seconds ('10m') without progress on any rank (no output, no metric, no "
        "SDK heartbeat) after which the job counts as hung: every rank's stack is dumped. "
        "None: the cluster's default, if any.")
    on_hang: Literal["dump", "fail", "requeue"] = Field(
        "dump", description="What a hang does after the dump: dump (keep running), fail, or "
        "requeue (a new attempt).")
    keep_alive_on_failure: float | None = Field(
        None, ge=0, le=24 * 3600,
        description="Seconds ('10m') a failed gang's nodes stay reserved (its processes "
        "ended) so that `job exec` can look at its directories and container.")
    max_output: int | None = Field(
        None, gt=0, le=MAX_SIZE,
        description="Bytes ('10G', '512M') the job's outputs may hold on each node; writing "
        "past it fails the job (cause 'output limit'). None: the cluster's max_output.")
    max_pids: int | None = Field(
        None, ge=MIN_PIDS, le=MAX_PIDS,
        description="Processes and threads the job may have at once on each node (its "
        "cgroup's pids.max), at most the cluster's max_pids; reaching it fails the job "
        "(cause 'process limit'). None: the cluster's.")
    checkpoint_signal: str = Field(
        DEFAULT_SIGNAL, description="Signal ('SIGUSR1', 'USR1') the ranks get as a preemption "
        "notice, before the SIGTERM; 'none': only the notice file and should_checkpoint().")
    checkpoint_notice: float = Field(
        60.0, ge=0, le=3600, description="Seconds ('2m') between the preemption notice and the "
        "SIGTERM; a checkpoint reported after the notice ends the wait at once.")

    @field_validator("checkpoint_signal", mode="before")
    @classmethod
    def _signal(cls, value: Any) -> Any:
        return parse_signal(value)

    @field_validator("max_wall_clock", "grace_period", "hang_timeout", "keep_alive_on_failure",
                     "checkpoint_notice", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        return parse_duration(value)

    @field_validator("max_output", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else parse_size(value)


class RegistrySpec(_Model):
    """Where a private image is pulled from, and the login for it (Batch AI
    imageSourceRegistry, Azure ML base_image_registry)."""

    server: str | None = Field(
        None, description="Registry host[:port], e.g. myregistry.azurecr.io or 127.0.0.1:5000; "
        "it must be the image's own registry. None: the registry the image names.")
    username: str | None = Field(None, min_length=1, max_length=1024)
    password: str | None = Field(
        None, min_length=1, max_length=16384, repr=False,
        description="Secret: sealed at rest, shown back as ***.")
    password_secret: str | None = Field(
        None, pattern=ENV_ID_RE,
        description="The name of one of the job's secrets that holds the password (Batch AI "
        "passwordSecretReference).")

    @field_validator("server")
    @classmethod
    def _server(cls, value: str | None) -> str | None:
        return value if value is None else check_host(value)

    @model_validator(mode="after")
    def _login(self) -> RegistrySpec:
        if self.password is not None and self.password_secret is not None:
            raise ValueError("give password or password_secret, not both")
        has_password = self.password is not None or self.password_secret is not None
        if self.username is not None and not has_password:
            raise ValueError("username needs a password or a password_secret")
        if has_password and self.username is None:
            raise ValueError("a password needs a username")
        return self


class Environment(_Model):
    """What the ranks run with: the node's own interpreter, or a container image (pulled per
    ``pull_policy``, with ``registry``'s login) that every rank of a node runs inside."""

    python: str | None = Field(
        None, description="Interpreter used for `python` in commands (Batch AI "
        "pythonInterpreterPath)."
    )
    image: str | None = Field(
        None, description="Container image the ranks run in ([registry[:port]/]name[:tag]"
        "[@digest]); None: no container, the ranks run on the node itself.")
    registry: RegistrySpec | None = Field(
        None, description="A private registry's login for the image.")
    pull_policy: Literal["always", "if_missing", "never"] = Field(
        "if_missing", description="always: pull before every attempt; if_missing: pull when "
        "the node does not have the image; never: the node must have it.")
    shm_size: str | None = Field(
        None, description="Size of the container's /dev/shm, docker --shm-size syntax (8g, "
        "512m); None: the launcher's default. Container jobs only.")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return value if value is None else check_image(value)

    @field_validator("shm_size")
    @classmethod
    def _shm_size(cls, value: str | None) -> str | None:
        if value is not None:
            shm_bytes(value)
        return value

    @model_validator(mode="after")
    def _container(self) -> Environment:
        if self.image is None:
            if self.registry is not None:
                raise ValueError("registry applies to a container image: set image too")
            if self.shm_size is not None:
                raise ValueError("shm_size applies to container jobs: set image too (ranks "
                                 "outside a container use the node's own /dev/shm)")
        server = self.registry.server if self.registry else None
        if self.image is not None and server is not None and \
                not same_registry(self.image, server):
            own = registry_of(self.image)
            named = f"{server}/{self.image[len(own) + 1:] if own else self.image}"
            raise ValueError(f"registry.server {server!r} is not the registry of image "
                             f"{self.image!r}: name the registry in the image ({named!r}) or "
                             "leave server out")
        return self

    def check_secrets(self, secrets: dict[str, str]) -> None:
        """The registry's password_secret must be one of the job's secrets (JobSpec calls
        this: a field cannot see its siblings)."""
        name = self.registry.password_secret if self.registry else None
        if name is not None and name not in secrets:
            raise ValueError(f"environment.registry.password_secret: {name!r} is not one of "
                             "the job's secrets; add it under secrets")


class JobSpec(_Model):
    """A gang of ``nodes`` x ``processes_per_node`` processes running one command."""

    name: str | None = Field(None, pattern=NAME_RE, description="Unique within its experiment.")
    experiment: str | None = Field(None, pattern=NAME_RE)
    cluster: str | None = Field(None, pattern=NAME_RE)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION,
                                    description="Free text shown with the job.")
    nodes: int = Field(1, ge=1, le=10000, description="Nodes in the gang (all or nothing).")
    distribution: Distribution = Field(default_factory=Distribution)
    command: Command | None = None
    code: str | None = Field(
        None,
        description="Directory shipped with the job (snapshotted at submit); ranks start in it.",
    )
    prepare: Command | None = Field(
        None, description="Runs on every node before the ranks (Batch AI jobPreparation)."
    )
    environment: Environment = Field(default_factory=Environment)
    mpi: MpiSettings = Field(default_factory=MpiSettings)
    inputs: dict[str, InputSpec] = Field(default_factory=dict)
    outputs: dict[str, OutputSpec] = Field(default_factory=dict)
    mounts: list[MountSpec] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables.")
    secrets: dict[str, str] = Field(
        default_factory=dict, description="Secret environment variables; never shown back."
    )
    limits: Limits = Field(default_factory=Limits)
    priority: Priority = "normal"
    stdouterr_path_prefix: str | None = Field(
        None, description="Where rank logs go (Batch AI stdOutErrPathPrefix); it may start "
        "with one of Batch AI's path variables ($AZ_BATCHAI_JOB_TEMP, ...), expanded on the "
        "node."
    )
    tags: dict[str, str] = Field(default_factory=dict)
    array: str | None = Field(
        None, description="Run this job once per index, as Slurm's --array: '0-99%8' is "
        "indices 0 to 99, at most 8 running at once ('1,3,5-7', '0-15:4' too). Each job gets "
        "BATCHYARD_ARRAY_INDEX and SLURM_ARRAY_TASK_ID.")
    preflight: Literal["none", "network", "gpu", "all"] | None = Field(
        None, description="Checks on a multi-node gang before user code starts: network "
        "(all-pairs reachability and bandwidth), gpu (nvidia-smi health, a matmul per GPU), "
        "all. A node that fails is marked unusable and the gang is placed again. None: the "
        "cluster's default.")
    depends_on: list[Dependency] = Field(
        default_factory=list, max_length=100,
        description="Jobs that must end first: [{job: NAME, condition: succeeded|finished|"
        "failed}]. A dependency that can no longer be met fails this job, naming it.")

    @field_validator("stdouterr_path_prefix")
    @classmethod
    def _stdouterr(cls, value: str | None) -> str | None:
        return value if value is None else check_node_path(value)

    @field_validator("array")
    @classmethod
    def _array(cls, value: str | None) -> str | None:
        if value is not None:
            parse_array(value)
        return value

    @field_validator("inputs", mode="before")
    @classmethod
    def _input_short_form(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: {"path": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("outputs", mode="before")
    @classmethod
    def _output_short_form(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: {} if v is None else {"path_prefix": v} if isinstance(v, str) else v
                for k, v in value.items()
            }
        return value

    @field_validator("inputs", "outputs")
    @classmethod
    def _ids(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not re.fullmatch(ENV_ID_RE, key):
                raise ValueError(f"id {key!r} must be letters, digits and _ (it names an env var)")
        return value

    @field_validator("env", "secrets")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return check_env_names(value)

    @field_validator("env", "secrets", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        return stringify_env(value)

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        self.environment.check_secrets(self.secrets)
        dist = self.distribution
        if self.command is None and not dist.role_commands:
            raise ValueError("command is required")
        if isinstance(self.command, list) and not self.command:
            raise ValueError("command must not be an empty list")
        if dist.process_count is not None and dist.type not in ("mpi", "tensorflow"):
            raise ValueError("distribution.process_count applies to mpi and tensorflow jobs only")
        if dist.type == "tensorflow":
            total = self.total_processes
            ps = dist.parameter_server_count or 0
            workers = dist.worker_count if dist.worker_count is not None else total - ps
            if ps > total:
                raise ValueError(
                    f"distribution.parameter_server_count: {ps} is more than the "
                    f"{total} ranks (nodes x processes_per_node)"
                )
            if workers + ps != total:
                raise ValueError(
                    f"distribution: worker_count {workers} + parameter_server_count {ps} must "
                    f"equal nodes x processes_per_node = {total}"
                )
        elif dist.role_commands:
            raise ValueError("distribution.role_commands applies to tensorflow jobs only")
        if self.mpi.extra_args and dist.type != "mpi":
            raise ValueError("mpi.extra_args applies to mpi jobs (batchyard's mpirun line); "
                             "a custom job's own mpirun takes them in its command")
        if self.mpi.mca and dist.type not in ("mpi", "custom"):
            raise ValueError("mpi.mca applies to mpi jobs and to a custom job's own mpirun")
        for output in self.outputs.values():
            if output.mode == "rw_mount" and output.datastore is None and output.path is None:
                raise ValueError("outputs: rw_mount needs a datastore or a path")
        check_launchable(self)  # what execve would refuse (E2BIG) is refused now
        return self

    @property
    def total_processes(self) -> int:
        if self.distribution.type == "custom":
            return 1
        if self.distribution.process_count is not None:
            return self.distribution.process_count
        return self.nodes * self.distribution.processes_per_node

    def redacted(self) -> dict[str, Any]:
        """The spec as shown back to users: secret values and storage keys masked."""
        data = self.model_dump(mode="json", exclude_none=True)
        if data.get("secrets"):
            data["secrets"] = {k: "***" for k in data["secrets"]}
        for mount in data.get("mounts", []):
            if mount.get("account_key"):
                mount["account_key"] = "***"
        registry = data.get("environment", {}).get("registry") or {}
        if registry.get("password"):
            registry["password"] = "***"
        return data


_LEADING_VAR = re.compile(r"^\$(?:\{(\w+)\}|(\w+))(?=/|$)")


def check_node_path(value: str) -> str:
    """A directory on the node that starts with a variable must start with one of Batch AI's
    path variables (the node expands those, as Batch AI did: node/env.py); any other would
    stay unexpanded, a relative path named after it."""
    from batchyard.node.env import PATH_VARS

    found = _LEADING_VAR.match(value)
    if not value.startswith("$") or (found and (found[1] or found[2]) in PATH_VARS):
        return value
    named = ", ".join(f"${name}" for name in PATH_VARS)
    raise ValueError(f"{value!r}: a path here may start with one of {named}, not another "
                     "variable")


def check_env_names(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if not re.fullmatch(ENV_ID_RE, key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
    return value


def stringify_env(value: Any) -> Any:
    """Environment values as strings: numbers and booleans written as YAML scalars become
    their text; a list, a mapping or null is refused (naming the variable), never turned into
    Python's text of it."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(item, str):
            out[key] = item
        elif isinstance(item, bool | int | float):
            out[key] = str(item)
        else:
            kind = {list: "a list", dict: "a mapping", type(None): "null"}.get(
                type(item), type(item).__name__)
            raise ValueError(f"{key!r}: give a string, not {kind}")
    return out


def json_schema() -> dict[str, Any]:
    schema = JobSpec.model_json_schema()
    schema["$id"] = "https://batchyard.dev/schemas/job.json"
    schema["title"] = "batchyard job"
    return schema
