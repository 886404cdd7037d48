"""The Ray backend: a cluster's nodes are the live Ray nodes carrying the custom resource
``batchyard/<cluster>``; a gang is a STRICT_SPREAD placement group (one bundle pinned to each
chosen node, always waited with a timeout); one detached named actor per node starts that
node's launcher on its own host from a ticket (see ``ray_agent``). Ray is imported only when a
Ray cluster is used, so batchyard works without it (``pip install batchyard[ray]``).

Like every backend it only starts launchers, tells whether they live, stops what a dead one
left and execs on a node: states, logs, outputs, cancel/abort/finish and the MPI rsh relay go
over the node channel (HTTP) between each launcher and the server. Nothing is read from or
written to a disk the server and the raylets would share, so the raylets may run on hosts of
their own — provided they reach the server at the URL the launchers are given: a server bound
to loopback (the default, 127.0.0.1) is reachable only from its own host, so a Ray cluster
across hosts needs the server started with ``--host`` on an address those hosts can route to
(it then serves HTTPS; the launchers are handed its CA). A launch onto another host while the
server listens on loopback fails at once, saying so.

A node's work dir is chosen on its own host when the node is discovered (a zero-CPU task
pinned there, once per node; the answer is kept in the server's home): ``$BATCHYARD_NODE_ROOT``
from the raylet's environment, else the local backend's layout under the server's data root
if that path can be made there, else the host's temp dir.

No call blocks the reconciler for long: the connection is made in the background and waited
a bounded time, every Ray call that may hang on an unreachable head is bounded, and liveness
pings are answered asynchronously (an actor that stays silent ``LOST_AFTER`` seconds, or that
died with its node, is a gone launcher; Ray unreachable is *unknown*)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from batchyard.backends.base import Gang, NodeInfo
from batchyard.backends.dryrun import render_dry_run
from batchyard.backends.ray_agent import (
    NAMESPACE,
    NodeAgent,
    actor_name,
    kill_tagged,
    node_directory,
    run_here,
)
from batchyard.config import data_root, home
from batchyard.errors import SpecError
from batchyard.launchplan import read_json, write_json_atomic

log = logging.getLogger("batchyard.ray")

PG_TIMEOUT = 20.0  # seconds a placement group may take before the launch fails with a reason
START_TIMEOUT = 60.0  # the actors' start (a worker process on each node)
CONNECT_WAIT = 10.0  # one call waits this long for the connection (it goes on meanwhile)
BUSY_WAIT = 1.0  # a call finding a connection under way waits only this long for it
CALL_WAIT = 3.0  # a Ray call that may hang while the head is unreachable
LOST_AFTER = 5.0  # an actor silent this long counts as gone with its launcher
PING_EVERY = 0.5
STOP_WAIT = 1.0  # stop sends its kills and looks this long for them
PROBE_WAIT = 3.0  # a discovery waits this long for new nodes' directory probes
PROBE_PATIENCE = 60.0  # a probe unanswered this long is sent again
DISCOVER_EVERY = 1.0
SUSPECT_FOR = 60.0
FORGET_AFTER = 3600.0  # what is known of an actor nobody asked about for this long is dropped

T = TypeVar("T")

_lock = threading.RLock()
_connected: str | None = None
_connecting: threading.Thread | None = None
_connect_error: str | None = None
_connect_started = 0.0
_remote: dict[str, Any] = {}  # the remote agent class and tasks, made once per connection
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="batchyard-ray")
_agents: dict[str, _Agent] = {}  # actor name -> what this process knows of it
_pruned_at = 0.0
_released: set[str] = set()  # placement groups released by this process
_discovered: dict[str, tuple[float, list[NodeInfo]]] = {}
# "<ray node id>/<workspace>/<cluster>" -> the node's work dir, as its host chose it; kept in
# the server's home too, so that a restarted server never reports a live node as gone while
# it asks its host again
_dirs: dict[str, str] = {}
_dirs_loaded = False
_probes: dict[str, tuple[Any, float]] = {}
_requested: dict[str, str] = {}
_suspect: dict[str, float] = {}  # Ray node id -> when a gang lost it (hidden for SUSPECT_FOR)
_specs: dict[str, dict[str, Any]] = {}  # custom resource -> {ray_address, ray_token_file}


@dataclass
class _Agent:
    """This server process's view of one node's actor (rebuilt from the handle after a
    restart)."""

    handle: Any = None
    ping: Any = None  # the ping in flight
    sent: float = 0.0  # when the last ping went
    silent_since: float | None = None  # the first ping not answered yet
    answer: bool | None = None  # its last answer
    gone: str | None = None  # why its launcher counts as gone (final)
    dead: bool = False  # the actor itself is gone (with its worker or its node)
    used: float = field(default_factory=time.time)


def _agent(name: str) -> _Agent:
    global _pruned_at
    now = time.time()
    if now - _pruned_at > 60:
        _pruned_at = now
        for old in [n for n, a in _agents.items() if now - a.used > FORGET_AFTER]:
            del _agents[old]
    agent = _agents.setdefault(name, _Agent())
    agent.used = now
    return agent


def _dirs_file() -> Path:
    return home() / "ray-node-dirs.json"


def _known_dirs() -> dict[str, str]:
    global _dirs_loaded
    if not _dirs_loaded:
        saved = read_json(_dirs_file())
        if isinstance(saved, dict):
            _dirs.update({str(k): str(v) for k, v in saved.items()} | _dirs)
        _dirs_loaded = True
    return _dirs


def _save_dirs() -> None:
    with contextlib.suppress(OSError):
        write_json_atomic(_dirs_file(), dict(_dirs), mode=0o600)


def resource_name(cluster: str) -> str:
    return f"batchyard/{cluster}"


def _token(spec: dict[str, Any]) -> str | None:
    path = spec.get("ray_token_file")
    if path:
        return Path(os.path.expanduser(str(path))).read_text().strip() or None
    return None


def _bounded(fn: Callable[..., T], *args: Any, timeout: float = CALL_WAIT) -> T:
    """``fn(*args)`` on a helper thread, waited at most ``timeout`` seconds (a Ray call to
    an unreachable head may otherwise block for minutes)."""
    future = _pool.submit(fn, *args)
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"Ray did not answer within {timeout:g} s") from None


def _is_up(ray: Any) -> bool:
    return _connected is not None and bool(ray.is_initialized())


def _connect_now(address: str) -> None:
    global _connected, _connect_error
    import ray

    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING,
                 log_to_driver=False, configure_logging=False)
    except Exception as exc:
        with contextlib.suppress(Exception):
            ray.shutdown()
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        with _lock:
            _connect_error = why
        return
    remote: Any = ray.remote
    with _lock:
        _remote["agent"] = remote(num_cpus=0, max_concurrency=4)(NodeAgent)
        _remote["run_here"] = remote(num_cpus=0)(run_here)
        _remote["node_directory"] = remote(num_cpus=0)(node_directory)
        _remote["kill_tagged"] = remote(num_cpus=0)(kill_tagged)
        _connected, _connect_error = address, None


def connect(address: str | None, token: str | None = None, wait: float = CONNECT_WAIT) -> Any:
    """One Ray connection per server process, made on a background thread and waited at most
    ``wait`` seconds (``ray.init`` against an unreachable head, or with a wrong token, blocks
    for minutes; a call finding it under way longer than ``CONNECT_WAIT`` waits ``BUSY_WAIT``).
    The token goes through the environment Ray reads (``RAY_AUTH_TOKEN``) and is never logged
    or stored in a handle."""
    global _connecting, _connect_error, _connect_started
    if token and _connected is None:  # Ray reads these when it is imported and connects
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    import ray

    with _lock:
        if _is_up(ray):
            if address and address != _connected:
                raise SpecError(f"address: this server is connected to the Ray cluster at "
                                f"{_connected}; one Ray cluster per server")
            return ray
        if not address:
            raise SpecError("address: a Ray cluster needs the head's address (--address)")
        thread = _connecting
        busy = thread is not None and thread.is_alive()
        stuck = busy and time.monotonic() - _connect_started > CONNECT_WAIT
        if thread is None or not busy:
            _connect_error = None
            thread = threading.Thread(target=_connect_now, args=(address,),
                                      name="batchyard-ray-connect", daemon=True)
            _connecting, _connect_started = thread, time.monotonic()
            thread.start()
    thread.join(min(wait, BUSY_WAIT) if stuck else wait)
    with _lock:
        if _is_up(ray):
            return ray
        if thread.is_alive():
            raise SpecError(f"address: the Ray cluster at {address} has not answered yet "
                            "(still trying); is the head up, and the token right?")
        raise SpecError(f"address: cannot connect to the Ray cluster at {address} "
                        f"({_connect_error}); is the head up, and the token right?")


def _connect_handle(handle: dict[str, Any], wait: float = CONNECT_WAIT) -> Any:
    token = None
    if handle.get("token_file"):
        token = _token({"ray_token_file": handle["token_file"]})
    return connect(handle.get("address"), token, wait)


def _cluster_spec(node: NodeInfo) -> dict[str, Any]:
    """Where the node's Ray cluster is (as the last discovery saw it, else as the node's row
    recorded it: a server restarted between placing a gang and launching it)."""
    spec = _specs.get(str(node.resources.get("ray_resource"))) or node.resources
    return {"address": spec.get("ray_address") or _connected,
            "ray_token_file": spec.get("ray_token_file")}


def _connect_node(node: NodeInfo, wait: float = CONNECT_WAIT) -> Any:
    spec = _cluster_spec(node)
    return connect(spec["address"], _token(spec), wait)


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RayBackend:
    name = "ray"

    # --- nodes: discovered, not provisioned ----------------------------------------------

    def discover(self, cluster: str, workspace: str, spec: dict[str, Any]) -> list[NodeInfo]:
        """Live Ray nodes carrying ``batchyard/<cluster>``, in a stable order (join time is
        not exposed, so the node id orders them); cached for ``DISCOVER_EVERY`` seconds. A
        node is offered once its own host has told where its work dir is."""
        key = f"{workspace}/{cluster}"
        cached = _discovered.get(key)
        if cached and time.time() - cached[0] < DISCOVER_EVERY:
            return cached[1]
        ray = connect(spec.get("address"), _token(spec))
        wanted = resource_name(cluster)
        _specs[wanted] = {"ray_address": spec.get("address"),
                          "ray_token_file": spec.get("ray_token_file")}
        live = []
        for node in sorted(_bounded(ray.nodes), key=lambda n: n["NodeID"]):
            res = node.get("Resources") or {}
            if not node.get("Alive") or wanted not in res:
                continue
            if time.time() - _suspect.get(node["NodeID"], 0.0) < SUSPECT_FOR:
                continue  # lost under a gang: not offered again before Ray confirms or not
            live.append(node)
        dirs = self._node_dirs(ray, workspace, cluster, [n["NodeID"] for n in live])
        found = []
        for node in live:
            node_id, res = node["NodeID"], node.get("Resources") or {}
            directory = dirs.get(node_id)
            if directory is None:
                continue
            found.append(NodeInfo(_node_name(cluster, node_id), -1, node["NodeManagerAddress"],
                                  directory, {
                                      "cpus": int(res.get("CPU", 0)),
                                      "gpus": int(res.get("GPU", 0)),
                                      "memory_gb": round(float(res.get("memory", 0)) / 2**30, 1),
                                      "ray_node_id": node_id, "ray_resource": wanted,
                                      "host": node.get("NodeManagerHostname"),
                                      **_specs[wanted],
                                  }))
        _discovered[key] = (time.time(), found)
        return found

    @staticmethod
    def _node_dirs(ray: Any, workspace: str, cluster: str,
                   node_ids: list[str]) -> dict[str, str]:
        """Each node's work dir, as its own host chose it (asked once per node)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        known = _known_dirs()
        out: dict[str, str] = {}
        waiting: dict[str, Any] = {}
        fresh = []
        for node_id in node_ids:
            key = f"{node_id}/{workspace}/{cluster}"
            if key in known:
                out[node_id] = known[key]
                continue
            pending = _probes.get(key)
            if pending is None or time.time() - pending[1] > PROBE_PATIENCE:
                tail = Path("clusters", workspace, cluster, "nodes", _node_name(cluster, node_id))
                preferred = str(data_root() / tail)
                probe = _remote["node_directory"].options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
                pending = (probe.remote(preferred, str(tail)), time.time())
                _probes[key] = pending
                fresh.append(pending[0])
            waiting[key] = pending[0]
        if fresh:  # a new node shows up at once, not a discovery later (a worker's start)
            ray.wait(fresh, num_returns=len(fresh), timeout=PROBE_WAIT)
        for key, ref in waiting.items():
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue
            del _probes[key]
            try:
                known[key] = str(ray.get(ref, timeout=1))
            except Exception as exc:  # the node died or cannot host a work dir: ask again
                log.warning("Ray node %s: no work dir: %s", key.split("/")[0][:8], exc)
                continue
            out[key.split("/", 1)[0]] = known[key]
            _save_dirs()
        return out

    def provision_node(self, cluster: str, workspace: str, index: int,
                       size: dict[str, Any]) -> NodeInfo:
        raise SpecError(f"cluster {cluster!r}: Ray nodes are discovered, not provisioned; start "
                        f"a raylet with --resources '{{\"{resource_name(cluster)}\": 1}}'")

    def remove_node(self, node: NodeInfo) -> None:
        """A Ray node leaves by itself (and its host keeps its own work dir)."""
        node_id = str(node.resources.get("ray_node_id"))
        known = _known_dirs()
        for key in [k for k in known if k.startswith(f"{node_id}/")]:
            del known[key]
        _save_dirs()

    def request_resources(self, spec: dict[str, Any], bundles: list[dict[str, float]]) -> None:
        """Ask the Ray autoscaler for queued gangs (best effort: without an autoscaler this
        only records the demand)."""
        key = repr(bundles)
        if _requested.get(str(spec.get("address"))) == key:
            return
        connect(spec.get("address"), _token(spec))
        from ray.autoscaler.sdk import request_resources

        _bounded(lambda: request_resources(bundles=bundles))
        _requested[str(spec.get("address"))] = key

    # --- gangs ---------------------------------------------------------------------------

    @staticmethod
    def _bundles(gang: Gang) -> list[dict[str, float]]:
        out = []
        for node in gang.nodes:
            bundle = {"CPU": float(max(1, int(node.resources.get("cpus") or 1))),
                      str(node.resources.get("ray_resource")): 1.0}
            if int(node.resources.get("gpus") or 0):
                bundle["GPU"] = float(node.resources["gpus"])
            out.append(bundle)
        return out

    def dry_run(self, gang: Gang) -> str:
        lines = [f"# ray: placement group batchyard-{gang.attempt_uuid}, strategy STRICT_SPREAD"]
        for node, bundle in zip(gang.nodes, self._bundles(gang), strict=True):
            lines.append(f"#   bundle {node.index}: {bundle} on ray node "
                         f"{node.resources.get('ray_node_id')} ({node.name})")
        lines.append(f"# one detached actor per node (namespace {NAMESPACE}) writes the ticket "
                     "on its host and runs:")
        return "\n".join(lines) + "\n" + render_dry_run(gang)

    @staticmethod
    def _check_reachable(gang: Gang) -> None:
        """A server on loopback is out of reach of a raylet on another host: say so now,
        rather than leave its launcher knocking for ten minutes."""
        from batchyard.node.netif import interface_of

        host = urlsplit(gang.server_url).hostname or ""
        if not _is_loopback(host):
            return
        for node in gang.nodes:
            if interface_of(node.address) is None:
                raise RuntimeError(
                    f"the server listens on loopback ({gang.server_url}), out of reach of Ray "
                    f"node {node.name} on another host ({node.address}); start the server "
                    "with --host on an address the Ray nodes can reach")

    def launch(self, gang: Gang) -> dict[str, Any]:
        """Idempotent: the placement group and the actors are named after the attempt, and an
        agent that already started its launcher reports that one."""
        cluster_spec = _cluster_spec(gang.nodes[0])
        address = cluster_spec["address"]
        ray = connect(address, _token(cluster_spec))
        self._check_reachable(gang)
        from ray.util.placement_group import get_placement_group, placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pg_name = f"batchyard-{gang.attempt_uuid}"
        try:
            pg = get_placement_group(pg_name)
        except ValueError:
            selectors = [{"ray.io/node-id": str(n.resources.get("ray_node_id"))}
                         for n in gang.nodes]
            pg = placement_group(self._bundles(gang), strategy="STRICT_SPREAD", name=pg_name,
                                 lifetime="detached", bundle_label_selector=selectors)
        ready, _ = ray.wait([pg.ready()], timeout=PG_TIMEOUT)
        if not ready:
            ray.util.remove_placement_group(pg)
            wanted = ", ".join(f"{n.name}: {b}" for n, b in zip(gang.nodes, self._bundles(gang),
                                                                  strict=True))
            raise RuntimeError(f"Ray placement group (STRICT_SPREAD, {len(gang.nodes)} bundles: "
                               f"{wanted}) was not satisfiable within {PG_TIMEOUT:.0f} s")
        ca_pem = Path(gang.ca_file).read_text() if gang.ca_file else None
        layout = {"workspace": gang.workspace, "experiment": gang.experiment,
                  "job": gang.job_name}
        names = [actor_name(gang.attempt_uuid, r) for r in range(len(gang.nodes))]
        calls = []
        for rank, node in enumerate(gang.nodes):
            agent = _remote["agent"].options(
                name=names[rank], namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                num_gpus=int(node.resources.get("gpus") or 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=rank),
            ).remote(gang.attempt_uuid, rank, names, pg_name)
            _agent(names[rank]).handle = agent
            ticket = {"server": gang.server_url, "token": gang.launch_tokens[rank],
                      "node_dir": node.directory, "servers": list(gang.servers)}
            calls.append(agent.start.remote(ticket, ca_pem, layout))
        try:
            started = ray.get(calls, timeout=START_TIMEOUT)
        except Exception as exc:
            self._release(ray, names, pg_name)
            raise RuntimeError(f"the Ray actors of the gang did not start: "
                               f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                               ) from None
        launchers = [{"node_rank": rank, "actor": names[rank], **info}
                     for rank, info in enumerate(started)]
        return {"backend": self.name, "attempt": gang.attempt_uuid, "launchers": launchers,
                "tags": [f"{gang.attempt_uuid}/{r}" for r in range(len(gang.nodes))],
                "placement_group": pg_name, "address": address,
                "token_file": cluster_spec.get("ray_token_file"), "launched_at": time.time()}

    # --- liveness ------------------------------------------------------------------------

    def alive(self, handle: dict[str, Any]) -> list[bool | None]:
        """Per node rank, from its actor's last answer (pings are asynchronous: this never
        waits on a node). None while Ray itself is out of reach."""
        launchers = handle.get("launchers") or []
        try:
            ray = _connect_handle(handle, wait=BUSY_WAIT)
        except Exception as exc:
            log.debug("ray unreachable: %s", exc)
            return [None] * len(launchers)
        group = str(handle.get("placement_group"))
        out = [self._alive_one(ray, launcher, group) for launcher in launchers]
        if out and all(a is False for a in out):
            self._release(ray, [str(x["actor"]) for x in launchers], group)
        return out

    @staticmethod
    def _actor(ray: Any, name: str, timeout: float = CALL_WAIT) -> Any:
        agent = _agent(name)
        if agent.handle is None:
            agent.handle = _bounded(ray.get_actor, name, NAMESPACE, timeout=timeout)
        return agent.handle

    def _alive_one(self, ray: Any, launcher: dict[str, Any], group: str) -> bool | None:
        from ray.exceptions import ActorUnavailableError, RayActorError

        name = str(launcher["actor"])
        agent = _agent(name)
        if agent.gone is not None:
            return False
        now = time.time()
        if agent.ping is not None:
            ready, _ = ray.wait([agent.ping], timeout=0)
            if ready:
                agent.ping = None
                try:
                    answer = bool(ray.get(ready[0], timeout=1))
                except ActorUnavailableError:
                    pass  # out of reach for now: silent, not gone (yet)
                except RayActorError as exc:  # died: with its node, or released on purpose
                    return self._lost(ray, launcher, group,
                                      f"its Ray actor died ({type(exc).__name__})")
                except Exception as exc:
                    log.debug("ping of %s failed: %s", name, exc)
                else:
                    agent.silent_since, agent.answer = None, answer
                    if not answer:
                        agent.gone = "node launcher exited"
                    return answer
        if agent.silent_since is not None and now - agent.silent_since > LOST_AFTER:
            return self._lost(ray, launcher, group,
                              f"its Ray node stopped answering for {LOST_AFTER:g} s")
        if agent.ping is not None or now - agent.sent < PING_EVERY:
            return agent.answer
        try:
            actor = self._actor(ray, name)
        except ValueError:
            return self._lost(ray, launcher, group, "its Ray actor is gone")
        except Exception as exc:  # the head is out of reach: unknown
            log.debug("looking up %s failed: %s", name, exc)
            return None
        agent.ping, agent.sent = actor.alive.remote(), now
        if agent.silent_since is None:
            agent.silent_since = now
        return agent.answer

    @staticmethod
    def _lost(ray: Any, launcher: dict[str, Any], group: str, why: str) -> bool:
        """A launcher counts as gone with its actor. Unless the gang's placement group was
        removed (the gang ended and released itself), its Ray node is suspect: not offered to
        new gangs before Ray says whether it lives."""
        agent = _agent(str(launcher["actor"]))
        agent.gone, agent.dead = why, True
        agent.ping = agent.handle = agent.silent_since = None
        if _group_removed(ray, group):
            return False
        if launcher.get("node_id"):
            _suspect.setdefault(str(launcher["node_id"]), time.time())
        log.warning("node rank %s: %s", launcher.get("node_rank"), why)
        return False

    def _release(self, ray: Any, names: list[str], pg_name: str) -> None:
        """Kill the gang's actors and remove its placement group (idempotent, best effort;
        the actors also do it themselves once the whole gang's launchers have ended)."""
        if pg_name in _released:
            return
        _released.add(pg_name)
        from ray.util.placement_group import get_placement_group

        def release() -> None:
            for name in names:
                agent = _agent(name)
                with contextlib.suppress(Exception):
                    ray.kill(agent.handle or ray.get_actor(name, namespace=NAMESPACE),
                             no_restart=True)
                agent.handle, agent.ping = None, None
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(get_placement_group(pg_name))

        try:
            _bounded(release, timeout=CALL_WAIT)
        except TimeoutError:
            _released.discard(pg_name)  # try again on a later call

    def stop(self, handle: dict[str, Any], node_rank: int) -> None:
        """Kill what the launcher of that node left behind, on its own host: through its
        actor while that lives, and through a task pinned to its Ray node (if the node itself
        is gone, so is everything that ran there). Sent, then waited only briefly: the
        reconciler calls this while it holds the attempt's control, which the gang's other
        launchers are waiting on for their abort."""
        tags = handle.get("tags") or []
        launchers = handle.get("launchers") or []
        if node_rank >= len(tags) or node_rank >= len(launchers):
            return
        launcher, tag = launchers[node_rank], str(tags[node_rank])
        try:
            ray = _connect_handle(handle, wait=BUSY_WAIT)
        except Exception as exc:
            log.warning("stop of node rank %d: Ray is out of reach: %s", node_rank, exc)
            return
        name = str(launcher["actor"])
        refs = []
        if not _agent(name).dead:
            with contextlib.suppress(Exception):
                refs.append(self._actor(ray, name, timeout=1.0).stop.remote(tag))
        if launcher.get("node_id"):
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            task = _remote["kill_tagged"].options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(str(launcher["node_id"]),
                                                                   soft=False))
            refs.append(task.remote(tag))
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=STOP_WAIT)

    def exec(self, node: NodeInfo, argv: list[str], timeout: float) -> tuple[int, str, str]:
        """Run ``argv`` on the node's Ray node, as a zero-CPU task pinned there."""
        try:
            ray = _connect_node(node)
        except SpecError as exc:
            return 255, "", f"ray: {exc.message}\n"
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = _remote["run_here"].options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            str(node.resources.get("ray_node_id")), soft=False))
        env = {"BATCHYARD_NODE_NAME": node.name, "BATCHYARD_NODE_DIR": node.directory}
        try:
            result: tuple[int, str, str] = ray.get(
                task.remote(argv, node.directory, env, timeout), timeout=timeout + 30)
        except Exception as exc:
            return 255, "", f"ray: {type(exc).__name__}: {exc}\n"
        return result


def _group_removed(ray: Any, name: str) -> bool:
    if name in _released:
        return True
    from ray.util.placement_group import get_placement_group

    def removed() -> bool:
        try:
            group = get_placement_group(name)
        except ValueError:
            return True
        return bool(ray.util.placement_group_table(group).get("state") == "REMOVED")

    try:
        return _bounded(removed)
    except Exception:
        return False


def _node_name(cluster: str, node_id: str) -> str:
    return f"{cluster}-{node_id[:8]}"
