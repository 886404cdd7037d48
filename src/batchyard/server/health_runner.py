"""Health checks of nodes that are directories of the server's machine (the local backend's
virtual nodes; cluster ``health_check_every``): an agent checks its own machine, but for these
the server asks their backend (``ChecksNodeHealth``), in a thread (a GPU matmul takes
seconds; a reconciler pass must not wait), and applies the result on a later pass."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from batchyard.server.services import health
from batchyard.store.models import Cluster, Node, now


class LocalHealth:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._done: dict[int, dict[str, Any]] = {}

    def tick(self, session: Session, cluster: Cluster, nodes: list[Node],
             check: Callable[[str, list[int | str]], dict[str, Any]]) -> None:
        with self._lock:
            done, self._done = self._done, {}
        by_id = {n.id: n for n in nodes}
        for node_id, result in done.items():
            node = by_id.get(node_id)
            if node is not None:
                health.apply(session, cluster, node, result)
        stamp = now()
        for node in nodes:
            if node.id in done or not health.due(cluster, node, stamp):
                continue
            with self._lock:
                if node.id in self._running:
                    continue
                self._running.add(node.id)
            gpu_ids = list((node.resources or {}).get("gpu_ids") or [])
            threading.Thread(target=self._check, args=(check, node.id, node.directory, gpu_ids),
                             name=f"health-{node.name}", daemon=True).start()

    def _check(self, check: Callable[[str, list[int | str]], dict[str, Any]], node_id: int,
               directory: str, gpu_ids: list[int | str]) -> None:
        try:
            result = check(directory, gpu_ids)
        except Exception as exc:  # a check that breaks is a failed check, named
            result = {"at": now(), "ok": False, "checks": [],
                      "reason": f"the check itself failed: {type(exc).__name__}: {exc}"}
        with self._lock:
            self._running.discard(node_id)
            self._done[node_id] = result
