"""Pre-flight on real (simulated) machines: a server host and three agent hosts (network + UTS +
mount namespaces, tests/hostkit.py) in a `--backend machines` cluster. One host drops every
connection its peers open to it (an iptables rule in its own namespace; it still talks to the
server), so a gang with it cannot meet. A 2-node job with ``preflight: network`` placed on that
host and a good one: the pre-flight names the bad host unusable with the measured reason, the
attempt ends without using up a retry, and the job succeeds on the two good hosts. An admin
brings the host back with ``cluster node enable``.

Root only (namespaces): skipped elsewhere. Marked slow.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator

import pytest

from hostkit import Host, HostNet, require_root_netns
from sitekit import PY, Site
from yardkit import cli_env, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PORT = 18744
AGENT_WORK = "/var/lib/batchyard/agent"
CLUSTER = "pf"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Site, list[Host]]]:
    require_root_netns()
    base = tmp_path_factory.mktemp("preflight")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    env = cli_env(home)
    with HostNet() as net:
        server = net.add_host("server")
        agents = [net.add_host(f"pfhost{i}", hide=[home]) for i in (1, 2, 3)]
        url = f"https://{server.addr}:{PORT}"
        env["BATCHYARD_SERVER"] = url
        s = Site(net, server, home, work, env, url, PORT, CLUSTER)
        s.start_server()
        s.ok("cluster", "create", "-n", CLUSTER, "--backend", "machines", "-s",
             "Standard_D4_v2")
        argv = shlex.split(s.js("cluster", "join-command", "-n", CLUSTER)["command"])
        agent_env = {k: v for k, v in env.items() if not k.startswith("BATCHYARD_")}
        for host in agents:
            with open(work / f"agent-{host.name}.log", "ab") as log:
                host.popen([PY, "-m", "batchyard.cli.main", *argv[1:], "--work-dir",
                            AGENT_WORK, "--name", host.name], env=agent_env, stdout=log,
                           stderr=subprocess.STDOUT)
        s.wait_nodes(3, ("idle",), timeout=60)
        yield s, agents


def _block_peers(host: Host, peers: list[Host], action: str = "-I") -> None:
    """Drop new TCP connections from the peers to ``host`` (the server's are untouched)."""
    for peer in peers:
        host.run(["iptables", action, "INPUT", "-p", "tcp", "--syn", "-s", peer.addr,
                  "-j", "DROP"], check=True, timeout=20)


def test_unreachable_node_is_marked_unusable_and_the_job_runs_elsewhere(
        site: tuple[Site, list[Host]]) -> None:
    s, agents = site
    # a 1-node job holds one host, so the 2-node job is placed on the other two: the bad one
    blocker = s.write_job("blocker", {"command": "sleep 300"})
    s.submit(blocker, "blocker")
    held = s.wait_job("blocker", ("running",), timeout=60)["attempts"][-1]["nodes"][0]["node"]
    bad, good = [h for h in agents if h.name != held]
    _block_peers(bad, [h for h in agents if h is not bad])
    try:
        job_file = s.write_job("pfjob", {
            "nodes": 2, "preflight": "network",
            "distribution": {"type": "pytorch", "processes_per_node": 1},
            "command": "echo rank $RANK on $(hostname)"})
        s.submit(job_file, "pfjob")

        def unusable() -> dict[str, str] | None:
            node = next(n for n in s.nodes() if n["name"] == bad.name)
            return node if node["state"] == "unusable" else None

        node = wait_until(unusable, 90, 0.5, f"{bad.name} to be marked unusable")
        reason = node["reason"]
        assert reason.startswith(f"pre-flight of job pfjob: cannot reach {bad.addr}:"), reason
        assert reason.endswith(f" from {good.name} (timeout 2 s)"), reason
        first = s.job("pfjob")["attempts"][0]
        assert sorted(n["node"] for n in first["nodes"]) == sorted([bad.name, good.name])
        s.ok("job", "terminate", "-n", "blocker")
        job = s.wait_job("pfjob", timeout=120)
    finally:
        _block_peers(bad, [h for h in agents if h is not bad], "-D")
    assert job["state"] == "succeeded", job
    attempts = job["attempts"]
    assert len(attempts) == 2 and attempts[0]["state"] == "preempted", attempts
    assert sorted(n["node"] for n in attempts[1]["nodes"]) == sorted([good.name, held])
    events = [e["message"] or "" for e in job["events"]]
    verdict = f"pre-flight: node {bad.name} unusable: cannot reach {bad.addr}:"
    assert any(m.startswith(verdict) and m.endswith(f"from {good.name} (timeout 2 s)")
               for m in events), events
    assert any(m.startswith("attempt 1") and m.endswith("; requeued") and verdict in m
               for m in events), events
    assert any(m.startswith("pre-flight passed on 2 nodes") for m in events), events
    logs = s.logs("pfjob")
    assert f"on {good.name}" in logs and f"on {held}" in logs and bad.name not in logs, logs
    # the admin brings it back once it is fixed
    back = s.js("cluster", "node", "enable", "-c", CLUSTER, "-n", bad.name)
    assert back["state"] == "idle" and back["reason"] is None, back
    assert {n["name"]: n["state"] for n in s.nodes()}[bad.name] == "idle"


def test_two_nodes_cut_both_ways_fail_without_blaming(site: tuple[Site, list[Host]]) -> None:
    """Neither of two nodes reaches the other: nothing tells which is at fault, so the job
    fails naming the broken links and both nodes stay usable."""
    s, agents = site
    s.wait_nodes(3, ("idle",), timeout=60)
    blocker = s.write_job("blocker2", {"command": "sleep 300"})
    s.submit(blocker, "blocker2")
    held = s.wait_job("blocker2", ("running",), timeout=60)["attempts"][-1]["nodes"][0]["node"]
    one, two = [h for h in agents if h.name != held]
    _block_peers(one, [two])
    _block_peers(two, [one])
    try:
        job_file = s.write_job("pfcut", {"nodes": 2, "preflight": "network",
                                         "distribution": {"type": "custom"},
                                         "command": "true"})
        s.submit(job_file, "pfcut")
        job = s.wait_job("pfcut", timeout=90)
    finally:
        _block_peers(one, [two], "-D")
        _block_peers(two, [one], "-D")
        s.ok("job", "terminate", "-n", "blocker2")
    assert job["state"] == "failed" and len(job["attempts"]) == 1, job
    first, second = (n["node"] for n in job["attempts"][0]["nodes"])  # node rank order
    assert job["message"].startswith(
        f"pre-flight: nodes of the gang cannot reach each other ({first} -> {second}: "
        f"timeout 2 s; {second} -> {first}: timeout 2 s)"), job["message"]
    states = {n["name"]: n["state"] for n in s.wait_nodes(3, ("idle",), timeout=60)}
    assert states == {h.name: "idle" for h in agents}, states
