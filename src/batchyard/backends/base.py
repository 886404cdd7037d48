"""The backend protocol (kept under ten methods) and the plain data that crosses it.

Rules every backend shares (state transitions, redaction, retries, idempotent cancel) live in
the server's services, not here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, runtime_checkable

from batchyard.states import LAUNCHER_TERMINAL


@dataclass(frozen=True)
class NodeInfo:
    name: str
    index: int
    address: str
    directory: str
    resources: dict[str, Any]
    unusable: str | None = None  # why the backend cannot use it now (a drained Slurm node)


@dataclass
class Gang:
    """Everything needed to start one attempt of a job on its nodes."""

    job_id: int
    job_name: str
    workspace: str
    experiment: str
    attempt: int
    attempt_uuid: str
    attempt_dir: str
    checkpoint_dir: str
    spec: dict[str, Any]
    nodes: list[NodeInfo]
    api_url: str | None = None
    api_token: str | None = None
    code_archive: str | None = None  # snapshot id; nodes fetch it over the channel
    server_url: str = ""  # the server as nodes reach it (a backend may know better)
    launch_tokens: list[str] = field(default_factory=list)  # one credential per node rank
    ca_file: str | None = None  # the CA nodes on this host trust the server's HTTPS with
    nodes_wanted: int = 0  # a queueing backend's gang (Slurm): nodes are known once it starts
    cluster_spec: dict[str, Any] = field(default_factory=dict)
    cluster_size: dict[str, Any] = field(default_factory=dict)
    # the other servers of the database, for the tickets: where a launcher looks when its
    # server stops answering (a standby that took over)
    servers: list[str] = field(default_factory=list)
    created_by: str | None = None  # the submitter (None: before identities existed)
    hidden: list[str] = field(default_factory=list)  # the server's folders and credentials
    shared: list[str] = field(default_factory=list)  # beneath them: the workspace's datastores
    # a launch of this attempt got as far as the backend before (a server that died or failed
    # mid-launch): a queueing backend looks for the gang it may have handed over already
    maybe_submitted: bool = False

    @property
    def num_nodes(self) -> int:
        return len(self.nodes) or self.nodes_wanted


@dataclass
class NodeStatus:
    node_rank: int
    state: str  # starting | preparing | running | stopping | succeeded | failed | canceled |
    # timeout | aborted | preempted | lost
    exit_code: int | None = None
    message: str | None = None
    failed_rank: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)


NODE_TERMINAL = set(LAUNCHER_TERMINAL)


@dataclass
class GangStatus:
    nodes: list[NodeStatus]

    @property
    def done(self) -> bool:
        return all(n.state in NODE_TERMINAL for n in self.nodes)

    @property
    def running(self) -> bool:
        return all(n.state in ("running", "succeeded") for n in self.nodes)


@runtime_checkable
class Backend(Protocol):
    """A backend only starts node launchers, tells whether they still live, stops what a
    dead one left behind and execs on a node: everything else (state, logs, cancel, abort,
    outputs) goes over the node channel, the same for every backend."""

    name: str

    def provision_node(self, cluster: str, workspace: str, index: int,
                       size: dict[str, Any]) -> NodeInfo: ...

    def remove_node(self, node: NodeInfo) -> None: ...

    def dry_run(self, gang: Gang) -> str: ...

    def launch(self, gang: Gang) -> dict[str, Any]: ...

    def alive(self, handle: dict[str, Any]) -> list[bool | None]:
        """Per node rank: True (the launcher lives), False (it is gone), None (unknown)."""
        ...

    def stop(self, handle: dict[str, Any], node_rank: int) -> None:
        """Kill whatever the launcher of that node left behind (it is dead or hung)."""
        ...

    def exec(self, node: NodeInfo, argv: list[str], timeout: float) -> tuple[int, str, str]: ...


@runtime_checkable
class SplitsHostGpus(Protocol):
    """Backends whose nodes are slices of this machine (local): each node's GPUs are its own,
    so a size can ask for more than the machine has left."""

    def gpu_shortfall(self, size: dict[str, Any], count: int) -> str | None:
        """Why ``count`` more nodes of ``size`` cannot get their GPUs; None when they can."""
        ...


@runtime_checkable
class SupportsSetupTask(Protocol):
    """Backends that can run a node setup task (Batch AI ``nodeSetup.setupTask``)."""

    def start_setup(self, node: NodeInfo, command: str, env: dict[str, str]) -> None: ...

    def setup_result(self, node: NodeInfo) -> int | None: ...

    def setup_files(self, node: NodeInfo) -> list[tuple[str, bytes]]:
        """(name, content): the server stores what it is sent, never a node's path."""
        ...


@runtime_checkable
class ChecksNodeHealth(Protocol):
    """Backends whose nodes are directories of the server's own machine (local): the server
    runs their periodic health check (cluster ``health_check_every``) through the backend,
    as an agent runs its machine's; the result is ``node/healthcheck.py``'s."""

    def check_health(self, directory: str, gpu_ids: list[int | str]) -> dict[str, Any]: ...


@runtime_checkable
class SupportsDiscovery(Protocol):
    """Backends whose nodes join and leave by themselves (Ray): the node manager keeps the
    cluster's rows in sync with ``discover`` instead of provisioning nodes."""

    def discover(self, cluster: str, workspace: str, spec: dict[str, Any]) -> list[NodeInfo]: ...

    def request_resources(self, spec: dict[str, Any], bundles: list[dict[str, float]]) -> None: ...


@runtime_checkable
class SupportsJoin(Protocol):
    """Backends whose nodes join by themselves, each through its own agent (machines): the
    server neither provisions nor scales them, and a node whose agent falls silent is lost."""

    joins: bool


@dataclass(frozen=True)
class QueueState:
    """Where a gang stands in a backend's own queue."""

    state: str  # pending | running | ended
    reason: str = ""  # pending: the queue's reason in plain words; ended: what ended it
    nodes: tuple[str, ...] = ()  # running: the allocated node names, node rank order
    lost_nodes: tuple[str, ...] = ()  # ended by a node failure: the nodes that failed
    preempted: bool = False
    external_id: str = ""  # the queue's own job id (shown to users)


@runtime_checkable
class SupportsQueue(Protocol):
    """Backends with a scheduler of their own (Slurm): a gang is handed over at once and waits
    in that queue, with that queue's reason; its nodes are known only when it starts."""

    def queue_state(self, handle: dict[str, Any], fresh: bool = False) -> QueueState:
        """``fresh``: ask the queue now, not a recent cached answer."""
        ...

    def cancel(self, handle: dict[str, Any]) -> None:
        """Remove the gang from the queue or its allocation (idempotent)."""
        ...


@runtime_checkable
class SupportsStartReport(Protocol):
    """Queueing backends whose launchers can say which allocation they run in (Slurm:
    ``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ``SLURMD_NODENAME``). The first launcher's
    plan request is then the gang's start callback: the server binds the gang from it
    instead of asking the queue, which stays a slow safety net."""

    def started_from(self, handle: dict[str, Any], node_rank: int,
                     allocation: dict[str, str]) -> QueueState | None:
        """The running state that launcher's report shows, or None when it does not name
        this handle's job consistently (then the queue is asked)."""
        ...


_IMPLEMENTS: dict[tuple[type, Any], bool] = {}


def implements(backend: object, protocol: Any) -> bool:
    """``isinstance(backend, protocol)`` for a runtime protocol, answered once per class: the
    check walks the protocol's members every time, and a submit made several. A backend's
    methods are its class's, so the first instance answers for all."""
    key = (type(backend), protocol)
    known = _IMPLEMENTS.get(key)
    if known is None:
        known = _IMPLEMENTS[key] = isinstance(backend, protocol)
    return known


def has_queue(backend: object) -> TypeGuard[SupportsQueue]:
    return implements(backend, SupportsQueue)


def checks_health(backend: object) -> TypeGuard[ChecksNodeHealth]:
    return implements(backend, ChecksNodeHealth)
