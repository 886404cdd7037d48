"""Many machines at once against a real server (bench/fleet_sim.py measures it at scale):
a fleet's agents joining together, while others heartbeat, all get their node.

Before the agent routes committed in their own worker thread, 100 joins at once took all
of the server's 40 worker threads (SQLite: each writer waits for the one ahead), and the
first join's commit could then get no thread to run in: every join and heartbeat waited
30 s and failed with ``database is locked``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.timeout(300)

JOINS = 100


def test_a_fleet_joining_at_once_all_get_their_node(yard: Any) -> None:
    created = yard.http.post("/workspaces/default/clusters", json={
        "name": "fleet", "backend": "machines", "vm_size": "Standard_D2_v2",
        "manual": {"target_node_count": 0}})
    assert created.status_code == 201, created.text
    token = yard.http.post("/workspaces/default/clusters/fleet/join-tokens",
                           json={"ttl": 3600}).json()["token"]

    async def main() -> list[tuple[int, str]]:
        limits = httpx.Limits(max_connections=JOINS, max_keepalive_connections=JOINS)
        async with httpx.AsyncClient(base_url=yard.url + "/api/v1", limits=limits,
                                     timeout=60) as http:

            async def join(i: int) -> tuple[int, str]:
                resp = await http.post("/agent/join", json={
                    "join_token": token, "machine_id": uuid.uuid4().hex,
                    "hostname": f"m{i}", "name": f"m{i}", "address": "127.0.0.1",
                    "work_dir": f"/var/lib/fleet/m{i}", "resources": {"cpus": 2}})
                if resp.status_code != 200:
                    return resp.status_code, resp.text[:200]
                node, cred = resp.json()["node"], resp.json()["credential"]
                beat = await http.post(f"/agent/nodes/{node}/heartbeat", json={
                    "launchers": []}, headers={"Authorization": f"Bearer {cred}"})
                return beat.status_code, node

            return await asyncio.gather(*(join(i) for i in range(JOINS)))

    answers = asyncio.run(main())
    assert [code for code, _ in answers] == [200] * JOINS, [a for a in answers if a[0] != 200]
    assert sorted(node for _, node in answers) == sorted(f"m{i}" for i in range(JOINS))
    nodes = yard.http.get("/workspaces/default/clusters/fleet").json()["nodes"]
    assert len(nodes) == JOINS and {n["state"] for n in nodes} == {"idle"}
    assert "database is locked" not in (yard.home / "server.log").read_text()
