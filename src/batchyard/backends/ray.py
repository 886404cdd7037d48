"""The Ray backend: a cluster's nodes are the live Ray nodes carrying the custom resource
``batchyard/<cluster>``; a gang is a STRICT_SPREAD placement group (one bundle pinned to each
chosen node, always waited with a timeout); one detached named actor per node runs the same
node launcher as the local backend (see ``ray_agent``). Ray is imported only when a Ray
cluster is used, so batchyard works without it (``pip install batchyard[ray]``).

Status: the launchers write their status files in the attempt dir (shared here, since every
raylet of the test cluster is on this machine; each agent also answers pings with its node's
copy). A node whose agent dies or stops answering for ``LOST_AFTER`` seconds is ``lost``."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from batchyard.backends.base import NODE_TERMINAL, Gang, GangStatus, NodeInfo, NodeStatus
from batchyard.backends.local import LocalBackend
from batchyard.backends.ray_agent import NAMESPACE, RSH_AGENT, NodeAgent, actor_name, run_here
from batchyard.config import data_root
from batchyard.errors import SpecError
from batchyard.node import proctree
from batchyard.node.plan import AttemptPaths, read_json, write_json_atomic

PG_TIMEOUT = 20.0  # seconds a placement group may take before the launch fails with a reason
START_TIMEOUT = 60.0
LOST_AFTER = 5.0  # an unanswered ping older than this marks the node lost
DISCOVER_EVERY = 1.0

_lock = threading.RLock()
_connected: str | None = None
_agent_cls: Any = None
_pings: dict[str, tuple[Any, float]] = {}
_lost: dict[str, str] = {}
_discovered: dict[str, tuple[float, list[NodeInfo]]] = {}
_requested: dict[str, str] = {}
_suspect: dict[str, float] = {}  # Ray node id -> when a gang lost it (hidden for SUSPECT_FOR)
SUSPECT_FOR = 60.0
_specs: dict[str, dict[str, Any]] = {}  # custom resource -> {address, ray_token_file}


def resource_name(cluster: str) -> str:
    return f"batchyard/{cluster}"


def _token(spec: dict[str, Any]) -> str | None:
    path = spec.get("ray_token_file")
    if path:
        return Path(os.path.expanduser(str(path))).read_text().strip() or None
    return None


def connect(address: str | None, token: str | None = None) -> Any:
    """One Ray connection per server process; the token goes through the environment Ray
    reads (``RAY_AUTH_TOKEN``) and is never logged or stored in a handle."""
    global _connected, _agent_cls
    if token and _connected is None:  # Ray reads these when it is imported and connects
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    import ray

    with _lock:
        if _connected is not None and ray.is_initialized():
            if address and address != _connected:
                raise SpecError(f"address: this server is connected to the Ray cluster at "
                                f"{_connected}; one Ray cluster per server")
            return ray
        if not address:
            raise SpecError("address: a Ray cluster needs the head's address (--address)")
        try:
            ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError) as exc:
            ray.shutdown()
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SpecError(f"address: cannot connect to the Ray cluster at {address} "
                            f"({why}); is the head up, and the token right?") from None
        _connected = address
        remote: Any = ray.remote
        _agent_cls = remote(num_cpus=0, max_concurrency=4)(NodeAgent)
        return ray


def _connect_handle(handle: dict[str, Any]) -> Any:
    token = None
    if handle.get("token_file"):
        token = _token({"ray_token_file": handle["token_file"]})
    return connect(handle.get("address"), token)


class RayBackend:
    name = "ray"

    # --- nodes: discovered, not provisioned ----------------------------------------------

    def discover(self, cluster: str, workspace: str, spec: dict[str, Any]) -> list[NodeInfo]:
        """Live Ray nodes carrying ``batchyard/<cluster>``, in a stable order (join time is
        not exposed, so the node id orders them); cached for ``DISCOVER_EVERY`` seconds."""
        key = f"{workspace}/{cluster}"
        cached = _discovered.get(key)
        if cached and time.time() - cached[0] < DISCOVER_EVERY:
            return cached[1]
        ray = connect(spec.get("address"), _token(spec))
        wanted = resource_name(cluster)
        _specs[wanted] = {"address": spec.get("address"),
                          "ray_token_file": spec.get("ray_token_file")}
        found = []
        for node in sorted(ray.nodes(), key=lambda n: n["NodeID"]):
            res = node.get("Resources") or {}
            if not node.get("Alive") or wanted not in res:
                continue
            if time.time() - _suspect.get(node["NodeID"], 0.0) < SUSPECT_FOR:
                continue  # lost under a gang: not offered again before Ray confirms or not
            node_id = node["NodeID"]
            name = f"{cluster}-{node_id[:8]}"
            directory = data_root() / "clusters" / workspace / cluster / "nodes" / name
            found.append(NodeInfo(name, -1, node["NodeManagerAddress"], str(directory), {
                "cpus": int(res.get("CPU", 0)), "gpus": int(res.get("GPU", 0)),
                "memory_gb": round(float(res.get("memory", 0)) / 2**30, 1),
                "ray_node_id": node_id, "ray_resource": wanted,
            }))
        _discovered[key] = (time.time(), found)
        return found

    def provision_node(self, cluster: str, workspace: str, index: int,
                       size: dict[str, Any]) -> NodeInfo:
        raise SpecError(f"cluster {cluster!r}: Ray nodes are discovered, not provisioned; start "
                        f"a raylet with --resources '{{\"{resource_name(cluster)}\": 1}}'")

    def remove_node(self, node: NodeInfo) -> None:
        """A Ray node leaves by itself; nothing of ours lives on it between jobs."""

    def request_resources(self, spec: dict[str, Any], bundles: list[dict[str, float]]) -> None:
        """Ask the Ray autoscaler for queued gangs (best effort: without an autoscaler this
        only records the demand)."""
        key = repr(bundles)
        if _requested.get(str(spec.get("address"))) == key:
            return
        connect(spec.get("address"), _token(spec))
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=bundles)
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
        lines.append(f"# one detached actor per node (namespace {NAMESPACE}) runs:")
        return "\n".join(lines) + "\n" + LocalBackend().dry_run(gang)

    def launch(self, gang: Gang) -> dict[str, Any]:
        """Idempotent: the placement group and the actors are named after the attempt, and an
        agent that already started its launcher reports that one."""
        cluster_spec = _specs.get(str(gang.nodes[0].resources.get("ray_resource"))) or {}
        address = cluster_spec.get("address") or _connected
        ray = connect(address, _token(cluster_spec))
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
        attempt = AttemptPaths(Path(gang.attempt_dir))
        attempt.control.mkdir(parents=True, exist_ok=True)
        attempt.stdouterr.mkdir(parents=True, exist_ok=True)
        plans = LocalBackend()._plans(gang)  # the same plans, so the same env contract
        calls, names = [], []
        for rank, plan in enumerate(plans):
            plan.rsh_agent = [str(attempt.control / RSH_AGENT)]  # mpirun -> actors (ray_rsh)
            name = actor_name(gang.attempt_uuid, rank)
            gpus = int(gang.nodes[rank].resources.get("gpus") or 0)
            agent = _agent_cls.options(
                name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                num_gpus=gpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=rank)).remote(rank)
            plan.gpus = None
            calls.append(agent.start.remote(_plan_dict(plan), None))
            names.append(name)
        started = ray.get(calls, timeout=START_TIMEOUT)
        launchers = [{"node_rank": rank, "actor": names[rank], **info}
                     for rank, info in enumerate(started)]
        return {"backend": self.name, "attempt_dir": gang.attempt_dir, "launchers": launchers,
                "tags": [p.tag for p in plans], "placement_group": pg_name, "address": address,
                "token_file": cluster_spec.get("ray_token_file"), "launched_at": time.time()}

    def poll(self, handle: dict[str, Any]) -> GangStatus:
        ray = _connect_handle(handle)
        attempt = AttemptPaths(Path(handle["attempt_dir"]))
        nodes = []
        for launcher in handle["launchers"]:
            rank = int(launcher["node_rank"])
            status = read_json(attempt.status(rank)) or {}
            state = status.get("state", "starting")
            if state not in NODE_TERMINAL:
                lost = self._liveness(ray, launcher, handle["attempt_dir"])
                if lost:
                    state, status["message"] = "lost", lost
                    if "Ray" in lost and launcher.get("node_id"):
                        _suspect.setdefault(str(launcher["node_id"]), time.time())
            nodes.append(NodeStatus(
                node_rank=rank, state=state, exit_code=status.get("exit_code"),
                message=status.get("message"), failed_rank=status.get("failed_rank"),
                stdouterr_dir=status.get("stdouterr_dir"), raw=status))
        result = GangStatus(nodes)
        if result.done:
            self._release(ray, handle)
        return result

    @staticmethod
    def _liveness(ray: Any, launcher: dict[str, Any], attempt_dir: str) -> str | None:
        """None while the node's agent answers; otherwise why the node counts as lost."""
        name = str(launcher["actor"])
        if name in _lost:
            return _lost[name]
        pending = _pings.get(name)
        if pending is not None:
            ref, sent = pending
            ready, _ = ray.wait([ref], timeout=0)
            if ready:
                del _pings[name]
                try:
                    reply = ray.get(ref)
                except Exception as exc:  # RayActorError, ActorDiedError, node death
                    _lost[name] = f"Ray actor of node rank {launcher['node_rank']} died " \
                                  f"({type(exc).__name__})"
                    return _lost[name]
                if not reply["launcher_alive"] and reply["status"].get("state") not in \
                        NODE_TERMINAL:
                    _lost[name] = "node launcher died"
                    return _lost[name]
                return None
            if time.time() - sent > LOST_AFTER:
                _lost[name] = f"Ray node of node rank {launcher['node_rank']} stopped " \
                              f"answering for {LOST_AFTER:.0f} s"
                return _lost[name]
            return None
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            _lost[name] = "its Ray actor is gone"
            return _lost[name]
        _pings[name] = (actor.ping.remote(attempt_dir), time.time())
        return None

    def _release(self, ray: Any, handle: dict[str, Any]) -> None:
        """Kill the agents and remove the placement group (idempotent)."""
        from ray.util.placement_group import get_placement_group

        for launcher in handle["launchers"]:
            name = str(launcher["actor"])
            _pings.pop(name, None)
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        with contextlib.suppress(ValueError):
            ray.util.remove_placement_group(get_placement_group(handle["placement_group"]))

    def _relay(self, handle: dict[str, Any], name: str, payload: dict[str, Any] | None) -> None:
        ray = _connect_handle(handle)
        for launcher in handle["launchers"]:
            if str(launcher["actor"]) in _lost:
                continue
            try:
                actor = ray.get_actor(str(launcher["actor"]), namespace=NAMESPACE)
            except ValueError:
                continue
            actor.control.remote(handle["attempt_dir"], name, payload)

    def cancel(self, handle: dict[str, Any], state: str, message: str, grace: float) -> None:
        attempt = AttemptPaths(Path(handle["attempt_dir"]))
        payload = {"state": state, "message": message, "grace": grace, "at": time.time()}
        if not attempt.cancel.exists():
            write_json_atomic(attempt.cancel, payload)
        self._relay(handle, attempt.cancel.name, payload)
        for node in self.poll(handle).nodes:
            if node.state == "lost":
                self.sweep(handle, node.node_rank)

    def sweep(self, handle: dict[str, Any], node_rank: int) -> None:
        """Kill what a lost node's launcher left: through its agent when it still answers,
        and on this host by process tag (every raylet of a one-machine cluster is here)."""
        tags = handle.get("tags") or []
        if node_rank >= len(tags):
            return
        name = str(handle["launchers"][node_rank]["actor"])
        if name not in _lost:
            ray = _connect_handle(handle)
            with contextlib.suppress(ValueError):
                ray.get_actor(name, namespace=NAMESPACE).kill_tree.remote(tags[node_rank])
        proctree.kill_everything(tags[node_rank], grace=0.0)

    def finish(self, handle: dict[str, Any]) -> None:
        attempt = AttemptPaths(Path(handle["attempt_dir"]))
        attempt.finish.touch()
        self._relay(handle, attempt.finish.name, None)

    def exec(self, node: NodeInfo, argv: list[str], timeout: float) -> tuple[int, str, str]:
        """Run ``argv`` on the node's Ray node, as a zero-CPU task pinned there."""
        ray = connect(_connected)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0)(run_here).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(
                str(node.resources.get("ray_node_id")), soft=False))
        env = {"BATCHYARD_NODE_NAME": node.name, "BATCHYARD_NODE_DIR": node.directory}
        try:
            result: tuple[int, str, str] = ray.get(
                task.remote(argv, node.directory, env, timeout), timeout=timeout + 30)
        except Exception as exc:
            return 255, "", f"ray: {type(exc).__name__}: {exc}\n"
        return result


def _plan_dict(plan: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(plan)
