"""`job exec -it` and `cluster node exec -it` across real (simulated) machines: a server host
and two agent hosts (tests/hostkit.py network namespaces; nothing crosses but HTTPS). The
server never reaches a node: the node's launcher (or its agent) opens the way back, so a shell
on node 1 runs on node 1's host, with its address, its hostname and its job directories.

Root only (namespaces): skipped elsewhere."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostkit import Host, HostNet, require_root_netns
from ptykit import Pty
from sitekit import PY, Site
from yardkit import cli_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PORT = 18762
CLUSTER = "pair"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Site, list[Host]]]:
    require_root_netns()
    base = tmp_path_factory.mktemp("exec-multihost")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    env = cli_env(home)
    with HostNet() as net:
        server = net.add_host("server")
        agents = [net.add_host(f"box{i}", hide=[home]) for i in (1, 2)]
        url = f"https://{server.addr}:{PORT}"
        env["BATCHYARD_SERVER"] = url
        s = Site(net, server, home, work, env, url, PORT, CLUSTER)
        s.start_server()
        s.ok("cluster", "create", "-n", CLUSTER, "--backend", "machines", "-s",
             "Standard_D2_v2")
        line = s.js("cluster", "join-command", "-n", CLUSTER)["command"]
        agent_env = {k: v for k, v in env.items() if not k.startswith("BATCHYARD_")}
        for host in agents:
            argv = [PY, "-m", "batchyard.cli.main", *shlex.split(line)[1:], "--work-dir",
                    "/var/lib/batchyard/agent", "--name", host.name]
            with open(work / f"agent-{host.name}.log", "ab") as log:
                host.popen(argv, env=agent_env, stdout=log, stderr=subprocess.STDOUT)
        s.wait_nodes(2, ("idle",), timeout=60)
        yield s, agents


def in_terminal(site: Site, *args: str) -> Pty:
    """The CLI on the server host, in a terminal."""
    return Pty(site.server.enter([PY, "-m", "batchyard.cli.main", *args], cwd=site.work),
               {**site.env, "TERM": "xterm"}, Path("/"))


def test_job_exec_it_runs_on_node_1s_machine(site: tuple[Site, list[Host]]) -> None:
    s, agents = site
    job = s.write_job("spread", {"nodes": 2, "command": "sleep 600",
                                 "distribution": {"type": "pytorch", "processes_per_node": 1},
                                 "limits": {"grace_period": 2}})
    s.submit(job, "spread")
    running = s.wait_job("spread", ("running",), timeout=90)
    node1 = running["attempts"][-1]["nodes"][1]["node"]
    host = next(h for h in agents if h.name == node1)
    term = in_terminal(s, "job", "exec", "spread", "--node", "1", "-it")
    term.expect(r"[#$] $")
    term.send('echo "H=$(hostname) N=$NODE_RANK IPS=$(echo $BATCHYARD_NODE_IPS | tr " " ,)'
              ' WD=$([ "$PWD" = "$BATCHYARD_WORK_DIR" ] && echo same)"; exit 2\r')
    found = term.expect(r"H=(\S+) N=1 IPS=(\S+) WD=same")
    assert found.group(1).decode() == host.name
    assert found.group(2).decode().split(",")[1] == host.addr
    assert term.wait() == 2
    s.ok("job", "terminate", "spread")


def expect_or_show(site: Site, host: Host, term: Pty, pattern: str,
                   timeout: float) -> re.Match[bytes]:
    """``term.expect``; when the pattern does not come, the assertion also shows the ends of
    the agent's and the server's logs (where a session that never started says why)."""
    try:
        return term.expect(pattern, timeout=timeout)
    except AssertionError as exc:
        logs = [site.work / f"agent-{host.name}.log", site.home / "server.log"]
        tails = "".join(f"\n--- {p.name}:\n" + p.read_text(errors="replace")[-3000:]
                        for p in logs if p.exists())
        raise AssertionError(f"{exc}{tails}") from None


def test_cluster_node_exec_it_through_the_agent(site: tuple[Site, list[Host]]) -> None:
    s, agents = site
    host = agents[1]
    term = in_terminal(s, "cluster", "node", "exec", "-c", CLUSTER, "-n", host.name, "-it")
    # generous: on a loaded machine the CLI's start, the agent's next heartbeat, the shell's
    # start and the relay of its first output each take their time; the prompt is the
    # condition waited on, so a quick machine waits no longer
    expect_or_show(s, host, term, r"[#$] $", timeout=180)
    term.send('echo "H=$(hostname) IP=$(hostname -I | tr -d " ")"; exit 6\r')
    found = expect_or_show(s, host, term, r"H=(\w+) IP=([0-9.]+)", timeout=60)
    assert (found.group(1).decode(), found.group(2).decode()) == (host.name, host.addr)
    assert term.wait(timeout=60) == 6


def test_keep_alive_outlives_the_agents_sweep(site: tuple[Site, list[Host]]) -> None:
    """An agent sweeps the launchers the server no longer lists (15 s after SIGTERM): a
    failed gang held for exec stays listed, so its node is still there well after that."""
    s, _agents = site
    job = s.write_job("held", {"nodes": 2, "distribution": {"type": "pytorch",
                                                             "processes_per_node": 1},
                               "command": 'echo "on $(hostname)" > "$AZ_BATCHAI_JOB_TEMP/m"; '
                                          '[ "$NODE_RANK" = 1 ] && exit 3; sleep 600',
                               "limits": {"grace_period": 2, "keep_alive_on_failure": "2m"}})
    s.submit(job, "held")
    failed = s.wait_job("held", timeout=90)
    assert failed["state"] == "failed" and "nodes held until" in failed["pending_reason"]
    time.sleep(20)  # longer than the agent's sweep grace
    out = s.cli("job", "exec", "held", "--node", "1", "--", "sh", "-c",
                'cat "$AZ_BATCHAI_JOB_TEMP/m"')
    node1 = failed["attempts"][-1]["nodes"][1]["node"]
    assert out.returncode == 0 and out.stdout == f"on {node1}\n", out
    s.ok("job", "terminate", "held")
    deadline = time.time() + 60
    while time.time() < deadline and s.job("held")["assigned_nodes"]:
        time.sleep(0.5)
    assert s.job("held")["assigned_nodes"] == []
