"""A node's network pre-flight over real loopback sockets: three nodes' listeners and probes,
the figures `cluster diagnose` measures, and a peer whose published port takes nothing."""

from __future__ import annotations

import socket
import threading
from typing import Any

from batchyard.launchplan import NodePlan
from batchyard.node.preflight import Preflight


def _plan(rank: int, n: int) -> NodePlan:
    return NodePlan(job_id=1, job_name="j", workspace="w", experiment="e", attempt=1,
                    attempt_uuid="u", node_rank=rank, node_names=[f"n{i}" for i in range(n)],
                    node_addrs=["127.0.0.1"] * n, distribution={"type": "custom"},
                    command="true", prepare=None, attempt_dir="/tmp/x", node_dir="/tmp",
                    checkpoint_dir="/tmp/c", master_addr="127.0.0.1", master_port=1,
                    preflight="network")


def _run(checks: list[Preflight], ports: list[list[int]]) -> list[dict[str, Any]]:
    for check in checks:
        check.meet(ports)
    results: list[dict[str, Any]] = [{} for _ in checks]

    def one(i: int) -> None:
        results[i] = checks[i].measure()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(checks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for check in checks:
        check.close()
    return results


def test_three_nodes_reach_and_measure_each_other() -> None:
    said: list[str] = []
    checks = [Preflight(_plan(r, 3), said.append) for r in range(3)]
    ports = [[1000 + r, *c.ports()] for r, c in enumerate(checks)]  # theirs last
    results = _run(checks, ports)
    for rank, result in enumerate(results):
        links = {link["peer_rank"]: link for link in result["links"]}
        assert sorted(links) == [p for p in range(3) if p != rank]
        assert all(link["ok"] for link in links.values()), result
        for peer, link in links.items():  # the lower rank leads each pair's ping-pong
            assert ("bandwidth_MBps" in link) == (rank < peer), link
            if rank < peer:
                assert link["bandwidth_MBps"] > 1 and 0 < link["latency_us"] < 1e6
    assert any("latency" in line and "MB/s (4 MiB)" in line for line in said), said


def test_a_port_that_takes_nothing_is_reported() -> None:
    checks = [Preflight(_plan(r, 2), lambda _m: None) for r in range(2)]
    ports = [c.ports() for c in checks]
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
    checks[1].close()
    results = _run(checks[:1], [ports[0], [dead]])
    (link,) = results[0]["links"]
    assert link == {"peer": "n1", "peer_rank": 1, "addr": f"127.0.0.1:{dead}", "ok": False,
                    "error": "connection refused"}
