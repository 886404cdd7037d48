"""Periodic health checks on real (simulated) machines (issue 36 §4): a server host and two
agent hosts (network + UTS + mount namespaces, tests/hostkit.py) in a `--backend machines`
cluster with `--health-check-every 2s`. One host's agent work dir is a 16 MiB tmpfs: a
bounded file fills it, the host becomes `unusable` with the measured reason (its free space,
the size, the floor) while the other stays idle, and once the file is removed it passes its
checks 3 times in a row and is idle again by itself. Each check also times the server.

Root only (namespaces): skipped elsewhere. Marked slow."""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hostkit import Host, HostNet, require_root_netns
from sitekit import PY, Site
from yardkit import cli_env, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PORT = 18746
AGENT_WORK = "/var/lib/batchyard/agent"
CLUSTER = "hc"
FILL = ("import shutil, sys; free = shutil.disk_usage(sys.argv[1]).free; "
        "open(sys.argv[1] + '/filler', 'wb').write(b'0' * (free - (256 << 10)))")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Site, list[Host]]]:
    require_root_netns()
    base = tmp_path_factory.mktemp("health")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    env = cli_env(home)
    with HostNet() as net:
        server = net.add_host("server")
        agents = [net.add_host(f"hchost{i}", hide=[home]) for i in (1, 2)]
        small = agents[0]
        small.run(["sh", "-c", f"mkdir -p {AGENT_WORK} && mount -t tmpfs -o size=16m,mode=0700 "
                   f"hc-small {AGENT_WORK}"], check=True, timeout=20)
        url = f"https://{server.addr}:{PORT}"
        env["BATCHYARD_SERVER"] = url
        s = Site(net, server, home, work, env, url, PORT, CLUSTER)
        s.start_server()
        created = s.js("cluster", "create", "-n", CLUSTER, "--backend", "machines", "-s",
                       "Standard_D4_v2", "--health-check-every", "2s")
        assert created["health_check_every"] == 2.0, created
        argv = shlex.split(s.js("cluster", "join-command", "-n", CLUSTER)["command"])
        agent_env = {k: v for k, v in env.items() if not k.startswith("BATCHYARD_")}
        for host in agents:
            with open(work / f"agent-{host.name}.log", "ab") as log:
                host.popen([PY, "-m", "batchyard.cli.main", *argv[1:], "--work-dir",
                            AGENT_WORK, "--name", host.name], env=agent_env, stdout=log,
                           stderr=subprocess.STDOUT)
        s.wait_nodes(2, ("idle",), timeout=60)
        yield s, agents


def _node(s: Site, name: str) -> dict[str, Any]:
    return next(n for n in s.nodes() if n["name"] == name)


def test_a_full_work_dir_makes_an_agent_node_unusable_until_space_is_freed(
        site: tuple[Site, list[Host]]) -> None:
    s, (small, other) = site
    started = time.time()

    def checked(name: str) -> dict[str, Any] | None:
        node = _node(s, name)
        last = (node.get("health") or {}).get("last") or {}
        return node if last.get("ok") and last.get("at", 0) > started else None

    node = wait_until(lambda: checked(small.name), 60, 0.5, "a passing check on the small host")
    checks = {c["name"]: c for c in node["health"]["last"]["checks"]}
    assert checks["disk"]["total_bytes"] == 16 << 20, checks
    assert checks["server"]["ok"] and checks["server"]["ms"] > 0, checks

    small.run([PY, "-c", FILL, AGENT_WORK], check=True, timeout=30)
    try:
        def unusable() -> dict[str, Any] | None:
            found = _node(s, small.name)
            return found if found["state"] == "unusable" else None

        node = wait_until(unusable, 60, 0.5, f"{small.name} to be unusable")
        reason = node["reason"]
        assert reason.startswith(f"health check: work dir {AGENT_WORK} has "), reason
        assert reason.endswith(" free of 16.0 MiB (under 819.2 KiB)"), reason
        assert _node(s, other.name)["state"] == "idle"
        assert checked(other.name) is not None
        listed = s.ok("cluster", "node", "list", "-c", CLUSTER)
        assert "unusable" in listed and "health check: work dir" in listed, listed
    finally:
        small.run(["rm", "-f", f"{AGENT_WORK}/filler"], check=True, timeout=20)
    freed = time.time()

    def idle() -> dict[str, Any] | None:
        found = _node(s, small.name)
        return found if found["state"] == "idle" else None

    node = wait_until(idle, 60, 0.5, f"{small.name} to come back once space is freed")
    assert node["reason"] is None and time.time() - freed >= 4.0, node
    # and it takes work again
    job_file = s.write_job("after", {"nodes": 2, "distribution": {"type": "custom"},
                                     "command": "hostname"})
    s.submit(job_file, "after")
    job = s.wait_job("after", timeout=120)
    assert job["state"] == "succeeded", job
    assert sorted(n["node"] for n in job["attempts"][-1]["nodes"]) == sorted(
        [small.name, other.name]), job
