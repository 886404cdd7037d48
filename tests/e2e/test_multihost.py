"""Real machines, simulated: a server host and three agent hosts, each a network + UTS + mount
namespace (tests/hostkit.py) with its own address, hostname (resolving to 127.0.1.1, as on
Debian) and private work dir; the server's home is hidden from the agent hosts, so nothing
crosses between them but HTTPS. A `--backend machines` cluster, agents joined with the line
`cluster join-command` prints, and the CLI run on the server host.

Checked: the nodes' real addresses and exec through an agent; the examples (env contract, gloo
DDP, Open MPI through the relay) across hosts; fail-fast; an agent killed with SIGKILL and
restarted (late: its node is lost and swept; at once: it re-attaches to its launchers); the
server killed with SIGKILL mid-job for longer than the heartbeat timeout and restarted (every
log line exactly once); a partition longer than the heartbeat timeout; and the security of
joins, node credentials and job tokens, with no secret left in logs or the database.

Root only (namespaces): skipped elsewhere. Marked slow; about 1.5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from hostkit import Host, HostNet, require_root_netns
from sitekit import (
    PY,
    TERMINAL,
    Site,
    assert_nothing_left,
    download,
    example,
    launcher_pids,
    rank_lines,
    show,
    tagged_in,
)
from yardkit import cli_env, wait_until
from yardkit import pid_alive as _alive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PORT = 18742
HEARTBEAT_TIMEOUT = 8.0
AGENT_WORK = "/var/lib/batchyard/agent"
CLUSTER = "farm"


@dataclass
class Farm(Site):
    agents: list[Host] = field(default_factory=list)
    join_line: str = ""
    agent_procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def wait_agents(self, states: tuple[str, ...] = ("idle",), timeout: float = 30
                    ) -> list[dict[str, Any]]:
        return self.wait_nodes(len(self.agents), states, timeout)

    # --- the agents -----------------------------------------------------------------------

    def agent_host(self, node: str) -> Host:
        return next(h for h in self.agents if h.name == node)

    def agent_argv(self, host: Host, line: str | None = None) -> list[str]:
        argv = shlex.split(line or self.join_line)
        assert argv[:2] == ["batchyard", "agent"], argv
        return [PY, "-m", "batchyard.cli.main", *argv[1:], "--work-dir", AGENT_WORK,
                "--name", host.name]

    def start_agent(self, host: Host, argv: list[str] | None = None) -> None:
        log = open(self.work / f"agent-{host.name}.log", "ab")  # noqa: SIM115
        try:
            proc = host.popen(argv or self.agent_argv(host), env=self.agent_env(),
                              stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self.agent_procs[host.name] = proc

    def agent_env(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if not k.startswith("BATCHYARD_")}



def hosts_of(farm: Farm, job: dict[str, Any]) -> list[Host]:
    """The hosts running the job's last attempt, in node rank order."""
    names = [n["node"] for n in job["attempts"][-1].get("nodes") or []]
    return [farm.agent_host(n) for n in names]


# --- the farm ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    require_root_netns()
    base = tmp_path_factory.mktemp("multihost")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    env = cli_env(home)
    with HostNet() as net:
        server = net.add_host("server")
        agents = [net.add_host(f"host{i}", hide=[home]) for i in (1, 2, 3)]
        url = f"https://{server.addr}:{PORT}"
        env["BATCHYARD_SERVER"] = url  # never start a local server behind the test's back
        f = Farm(net, server, home, work, env, url, PORT, CLUSTER, agents=agents)
        f.start_server()
        f.ok("cluster", "create", "-n", CLUSTER, "--backend", "machines", "-s",
             "Standard_D4_v2", "--heartbeat-timeout", f"{HEARTBEAT_TIMEOUT:g}")
        joined = f.js("cluster", "join-command", "-n", CLUSTER)
        assert url in joined["command"] and "warning" not in joined, joined
        f.join_line = joined["command"]
        for host in agents:
            f.start_agent(host)
        try:
            f.wait_agents(("idle",), timeout=60)
        except AssertionError as exc:
            logs = "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}"
                           for p in work.glob("agent-*.log"))
            raise AssertionError(f"the agents did not join: {exc}{logs}"
                                 + f.server_log_tail()) from None
        yield f


# --- 1. nodes ---------------------------------------------------------------------------------


def test_nodes_have_their_hosts_addresses(farm: Farm) -> None:
    nodes = {n["name"]: n for n in farm.nodes()}
    assert sorted(nodes) == ["host1", "host2", "host3"], nodes
    for host in farm.agents:
        node = nodes[host.name]
        assert node["address"] == host.addr and host.addr.startswith("10.231."), node
        assert node["state"] == "idle", node
    # exec runs on the machine itself, through its agent (queued with its heartbeat)
    host = farm.agents[1]
    out = farm.js("cluster", "node", "exec", "-c", CLUSTER, "-n", host.name, "--exec",
                  "hostname; hostname -I")
    assert out["exit_code"] == 0 and out["stdout"].split() == [host.name, host.addr], out


# --- 2. hello-distributed ---------------------------------------------------------------------



def test_hello_distributed_sees_node0_address(farm: Farm) -> None:
    folder = example(farm, "hello-distributed")
    farm.submit(folder / "job.yaml", "hello", cwd=folder)
    job = farm.wait_job("hello", timeout=60)
    logs = farm.logs("hello")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs}"
    node0, node1 = hosts_of(farm, job)
    assert node0 is not node1
    for rank in range(4):
        lines = "\n".join(rank_lines(logs, rank))
        host = node0 if rank < 2 else node1
        assert f"hello from {host.name} " in lines, logs
        assert f"MASTER_ADDR={node0.addr} " in lines, logs
        assert f"AZ_BATCH_MASTER_NODE={node0.addr}:" in lines, logs
        assert f"BATCHYARD_NODE_IPS: {node0.addr}, {node1.addr}" in lines, logs
        assert "env contract OK" in lines, logs
    dest = download(farm, "hello", "outputs/RESULT/summary.json")
    summary = json.loads((dest / "outputs" / "RESULT" / "summary.json").read_text())
    assert summary["node_ips"] == [node0.addr, node1.addr], summary
    assert summary["master"].startswith(f"{node0.addr}:") and summary["world_size"] == 4
    assert summary["rank0_hostname"] == node0.name


# --- 3. mnist-ddp: gloo across hosts ----------------------------------------------------------


def test_ddp_across_hosts_identical_parameters(farm: Farm) -> None:
    folder = example(farm, "mnist-ddp")
    spec = (folder / "job.yaml").read_text()
    assert "command: python train.py --epochs 5\n" in spec
    job_file = folder / "job-hashes.yaml"
    job_file.write_text(spec.replace("--epochs 5", "--epochs 2 --write-param-hashes"))
    farm.submit(job_file, "ddp", cwd=folder)
    job = farm.wait_job("ddp", timeout=150)
    logs = farm.logs("ddp")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-4000:]}"
    node0, node1 = hosts_of(farm, job)
    assert "world size 4, backend gloo" in logs, logs[-3000:]
    for bad in ("SIGABRT", "Aborted", "terminate called", "Traceback"):
        assert bad not in logs, logs[-3000:]
    assert re.search(r"test accuracy: 0\.[89]", logs), logs[-3000:]
    dest = download(farm, "ddp", "outputs/MODEL")
    model = dest / "outputs" / "MODEL"
    hashes = {p.name: p.read_text().strip() for p in model.glob("params-rank*.sha256")}
    assert sorted(hashes) == [f"params-rank{r}.sha256" for r in range(4)], hashes
    assert len(set(hashes.values())) == 1, hashes  # every rank ends with the same parameters
    assert (model / "model.pt").stat().st_size > 1000
    for rank in range(4):  # two ranks on each host, gloo between them over eth0
        host = node0 if rank < 2 else node1
        assert re.search(rf"^\[{host.name}/rank{rank}(:err)?\] ", logs, re.M), logs[-3000:]


# --- 4. mnist-mpi: Open MPI across hosts through the relay ------------------------------------


def test_mpi_across_hosts(farm: Farm) -> None:
    folder = example(farm, "mnist-mpi")
    farm.submit(folder / "job.yaml", "mpi", cwd=folder)
    job = farm.wait_job("mpi", timeout=180)
    logs = farm.logs("mpi")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-4000:]}"
    node0, node1 = hosts_of(farm, job)
    assert "MPI world size 8" in "\n".join(rank_lines(logs, 0)), logs[-3000:]
    files = [f["path"] for f in farm.js("job", "file", "list", "-n", "mpi")["files"]]
    for rank in range(8):  # each MPI rank's own log files, ranks 0-3 on node 0's host
        node = (node0 if rank < 4 else node1).name
        assert f"stdouterr/{node}-rank{rank}.stdout.txt" in files, files
    for host in (node0, node1):  # job preparation ran on both hosts
        assert f"jobprep on {host.name}:" in logs and "jobprep done" in logs, logs[-3000:]
    assert re.search(r"test accuracy: 0\.9", logs), logs[-3000:]
    assert "outputs/MODEL/model.npz" in files, files


# --- 5. fail-fast across hosts ----------------------------------------------------------------

FAIL_FAST = (
    'if [ "$RANK" = 1 ]; then sleep 1; echo "failing at $(date +%s.%N)"; exit 3; fi; '
    'echo "rank $RANK sleeping, gloo on $GLOO_SOCKET_IFNAME"; sleep 60'
)




def test_fail_fast_across_hosts(farm: Farm) -> None:
    job_file = farm.write_job("failfast", {
        "nodes": 2, "command": FAIL_FAST, "limits": {"grace_period": 2},
        "distribution": {"type": "pytorch", "processes_per_node": 1}})
    farm.submit(job_file, "failfast")
    job = farm.wait_job("failfast", timeout=40)
    logs = farm.logs("failfast")
    assert job["state"] == "failed", job
    node0, node1 = hosts_of(farm, job)
    failed_at = float(re.search(r"failing at ([0-9.]+)", logs)[1])  # type: ignore[index]
    took = job["ended_at"] - failed_at
    assert took < 10, f"the job failed {took:.1f}s after rank 1 exited"
    assert job["exit_code"] == 3
    message = job["message"]
    assert node1.name in message and "rank 1" in message and "code 3" in message, message
    # the hostnames resolve to 127.0.1.1: gloo is pointed at the interface of the node address
    assert "rank 0 sleeping, gloo on eth0\n" in logs, logs
    assert_nothing_left([node0, node1], job)
    assert job["ended_at"] - job["started_at"] < 30


# --- 6. an agent killed with SIGKILL mid-job, then restarted ----------------------------------

LINES = 40
NUMBERED = (f'echo "rank $RANK up"; for i in $(seq 1 {LINES}); do echo "rank $RANK line $i"; '
            'sleep 0.2; done')


def numbered(logs: str, rank: int) -> list[str]:
    return [line for line in rank_lines(logs, rank) if " line " in line]


def start_running(farm: Farm, name: str, command: str, **spec: Any) -> tuple[dict[str, Any],
                                                                               list[Host]]:
    """A 2 nodes x 1 process job, once both ranks run (each rank printed ``up``)."""
    job_file = farm.write_job(name, {
        "nodes": 2, "command": command, "limits": {"grace_period": 2},
        "distribution": {"type": "pytorch", "processes_per_node": 1}, **spec})
    farm.submit(job_file, name)
    farm.wait_job(name, ("running", *TERMINAL), timeout=30)
    wait_until(lambda: farm.logs(name).count(" up\n") >= 2, 20, what=f"both ranks of {name} up",
               interval=0.3)
    job = farm.job(name)
    assert job["state"] == "running", job
    return job, hosts_of(farm, job)


def test_agent_killed_and_restarted(farm: Farm) -> None:
    job, (node0, node1) = start_running(farm, "agentkill", 'echo "rank $RANK up"; sleep 120')
    uuid = job["attempts"][-1]["uuid"]
    victim = node1
    before = launcher_pids(victim, uuid) + tagged_in(victim, uuid)
    assert before, f"no process of the attempt on {victim.name}"
    proc = farm.agent_procs[victim.name]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)
    killed_at = time.time()
    job = farm.wait_job("agentkill", timeout=HEARTBEAT_TIMEOUT + 15)
    took = job["ended_at"] - killed_at
    assert job["state"] == "failed", job
    assert took < HEARTBEAT_TIMEOUT + 10, f"the job ended {took:.1f}s after the agent died"
    assert victim.name in job["message"] and "lost" in job["message"], job["message"]
    assert_nothing_left([node0], job)  # the healthy host tore its share down
    nodes = {n["name"]: n for n in farm.nodes()}
    assert nodes[victim.name]["state"] == "lost", nodes[victim.name]
    # the same command line and work dir: the agent re-attaches, then sweeps the old attempt
    farm.start_agent(victim)
    wait_until(lambda: {n["name"]: n for n in farm.nodes()}[victim.name]["state"] == "idle",
               30, what=f"{victim.name} to be idle again", interval=0.5)
    assert_nothing_left([victim], job)
    assert not [p for p in before if _alive(p)], before
    farm.wait_agents(("idle",), timeout=20)


def test_agent_restarted_quickly_reattaches(farm: Farm) -> None:
    """An agent back within the heartbeat timeout finds its launchers still running: the
    job goes on, untouched, and nothing is started twice."""
    job, (_node0, node1) = start_running(farm, "agentbounce", NUMBERED)
    uuid = job["attempts"][-1]["uuid"]
    before = launcher_pids(node1, uuid)
    assert len(before) == 1, before
    proc = farm.agent_procs[node1.name]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)
    farm.start_agent(node1)
    job = farm.wait_job("agentbounce", timeout=40)
    logs = farm.logs("agentbounce")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-3000:]}"
    assert len(job["attempts"]) == 1
    for rank in (0, 1):
        assert numbered(logs, rank) == [f"rank {rank} line {i}" for i in range(1, LINES + 1)]
    assert job["attempts"][-1]["nodes"][1]["pid"] == before[0]  # the same launcher
    farm.wait_agents(("idle",), timeout=20)


# --- 7. the server killed with SIGKILL mid-job, then restarted --------------------------------


def test_server_killed_and_restarted(farm: Farm) -> None:
    job, _hosts = start_running(farm, "srvkill", NUMBERED)
    pid = farm.server_pid()
    assert pid in farm.server.pids()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _alive(pid), 5, what="the server to die")
    # down for longer than the heartbeat timeout: the ranks keep printing, their launchers
    # spool and retry, and the server's own absence must not count against the nodes
    time.sleep(HEARTBEAT_TIMEOUT + 1)
    farm.start_server()
    assert farm.server_pid() != pid
    job = farm.wait_job("srvkill", timeout=60)
    logs = farm.logs("srvkill")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-3000:]}"
    assert len(job["attempts"]) == 1, job["attempts"]
    for rank in (0, 1):
        expected = [f"rank {rank} line {i}" for i in range(1, LINES + 1)]
        assert numbered(logs, rank) == expected, logs
    farm.wait_agents(("idle",), timeout=20)


# --- 8. a partition longer than the heartbeat timeout -----------------------------------------

STAMPED = ('echo "rank $RANK up"; for i in $(seq 1 150); do '
           'echo "rank $RANK line $i at $(date +%s.%N)"; sleep 0.2; done')


def test_partition_longer_than_heartbeat_timeout(farm: Farm) -> None:
    job, (node0, node1) = start_running(farm, "partition", STAMPED)
    cut = node1
    time.sleep(0.5)
    cut.link_down()
    cut_at = time.time()
    try:
        job = farm.wait_job("partition", timeout=HEARTBEAT_TIMEOUT + 10)
        time.sleep(max(0.0, cut_at + HEARTBEAT_TIMEOUT + 2 - time.time()))
    finally:
        cut.link_up()
    healed_at = time.time()
    assert job["state"] == "failed", job
    assert cut.name in job["message"] and "lost" in job["message"], job["message"]
    assert len(job["attempts"]) == 1, job["attempts"]

    def cut_off_lines() -> list[str]:
        """Rank 1's lines printed while its host was cut off, once they all arrived."""
        farm_job = farm.job("partition")
        if not all(n.get("state") in ("failed", "aborted", "canceled", "lost", "succeeded")
                   for n in farm_job["attempts"][-1]["nodes"]):
            return []
        lines = numbered(farm.logs("partition"), 1)
        return [line for line in lines if cut_at + 1 < float(line.rsplit(" ", 1)[1])
                < healed_at - 1]

    wait_until(cut_off_lines, 30, what="the lines printed while cut off to arrive",
               interval=0.5)
    logs = farm.logs("partition")
    for rank in (0, 1):
        seen = [int(line.split()[3]) for line in numbered(logs, rank)]
        assert seen == list(range(1, len(seen) + 1)), f"rank {rank}: {seen}"  # no dup, no gap
    farm.wait_agents(("idle",), timeout=30)
    assert_nothing_left([node0, node1], farm.job("partition"))


# --- 9. security ------------------------------------------------------------------------------


def curl(host: Host, url: str, token: str, ca: str, body: str | None = None) -> int:
    """The HTTP status of one call from inside ``host``, verified against the CA file."""
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", ca,
            "-H", f"Authorization: Bearer {token}", "--max-time", "20", url]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data", body]
    res = host.run(argv, timeout=30)
    assert res.returncode == 0, show(res)
    return int(res.stdout)


def intruder(farm: Farm, host: Host, line: str, tag: str) -> subprocess.CompletedProcess[str]:
    """An agent started with ``line`` in a fresh work dir (a machine that never joined)."""
    argv = shlex.split(line)
    argv = [PY, "-m", "batchyard.cli.main", *argv[1:], "--work-dir",
            f"/var/lib/batchyard/intruder-{tag}", "--name", f"intruder-{tag}"]
    return host.run(argv, env=farm.agent_env(), timeout=40)


# What a rank does with its job-scoped token: calls the agent and node-channel routes.
JOB_TOKEN_PROBE = """\
import json, os, ssl, urllib.request, urllib.error
api = os.environ["BATCHYARD_API"].rstrip("/") + "/api/v1"
ctx = ssl.create_default_context(cafile=os.environ["PROBE_CA"])
token = os.environ["BATCHYARD_TOKEN"]
uuid, node = os.environ["TORCHELASTIC_RUN_ID"], os.environ["BATCHYARD_NODE_NAME"]
calls = {
    "heartbeat": ("POST", f"/agent/nodes/{node}/heartbeat", {"launchers": []}),
    "command": ("POST", f"/agent/nodes/{node}/commands/1", {"exit_code": 0}),
    "plan": ("GET", f"/node/attempts/{uuid}/nodes/0/plan", None),
    "status": ("POST", f"/node/attempts/{uuid}/nodes/0/status",
               {"seq": 99, "status": {"state": "succeeded"}}),
    "logs": ("POST", f"/node/attempts/{uuid}/nodes/0/logs", {"files": {}}),
    "join-tokens": ("POST", "/workspaces/default/clusters/farm/join-tokens", {}),
}
codes = {}
for name, (method, path, body) in calls.items():
    req = urllib.request.Request(api + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Bearer " + token)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=20) as resp:
            codes[name] = resp.status
    except urllib.error.HTTPError as exc:
        codes[name] = exc.code
print("PROBE " + json.dumps(codes), flush=True)
"""


def test_security(farm: Farm) -> None:
    names = {n["name"] for n in farm.nodes()}
    host = farm.agents[0]
    line = farm.join_line
    token = re.search(r"--join-token (\S+)", line)[1]  # type: ignore[index]
    # a wrong join token
    wrong = intruder(farm, host, line.replace(token, "join.x" + token[6:][::-1]), "wrong")
    assert wrong.returncode != 0, show(wrong)
    assert "join refused" in wrong.stderr, show(wrong)
    # a wrong CA pin, with a valid fresh token: refused before the token is sent
    fresh = farm.js("cluster", "join-command", "-n", CLUSTER)
    pin = fresh["ca_sha256"]
    assert pin and pin in fresh["command"], fresh
    bad_pin = intruder(farm, host, fresh["command"].replace(pin, "ab" * 32), "pin")
    assert bad_pin.returncode != 0, show(bad_pin)
    assert "ca-sha256" in bad_pin.stderr, show(bad_pin)
    # revoked tokens (all of them, the fresh one included)
    revoked = farm.js("cluster", "join-token", "revoke", "-n", CLUSTER)
    assert revoked["revoked"] >= 2, revoked
    for tag, old in (("revoked", line), ("revoked2", fresh["command"])):
        refused = intruder(farm, host, old, tag)
        assert refused.returncode != 0, show(refused)
        assert "join refused" in refused.stderr, show(refused)
    assert {n["name"] for n in farm.nodes()} == names

    # a node credential acts for its own node only
    creds = {h.name: json.loads(h.read_file("agent/agent.json")) for h in farm.agents}
    one, other = farm.agents[0], farm.agents[1]
    ca = f"{AGENT_WORK}/ca.pem"
    beat = f"{farm.url}/api/v1/agent/nodes/{{}}/heartbeat"
    body = '{"launchers": []}'
    assert creds[one.name]["node"] == one.name
    assert curl(one, beat.format(other.name), creds[one.name]["credential"], ca, body) == 403
    assert curl(one, beat.format(one.name), creds[one.name]["credential"], ca, body) == 200
    assert curl(one, beat.format(one.name), "node.forged", ca, body) == 401

    # a job-scoped token cannot act as an agent or a node launcher
    job_file = farm.write_job("probe", {
        "nodes": 1, "command": "python probe.py", "code": ".",
        "env": {"PROBE_CA": ca}}, files={"probe.py": JOB_TOKEN_PROBE})
    farm.submit(job_file, "probe")
    job = farm.wait_job("probe", timeout=60)
    logs = farm.logs("probe")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs}"
    codes = json.loads(logs.split("PROBE ", 1)[1].splitlines()[0])
    assert all(code in (401, 403) for code in codes.values()), codes

    # no secret anywhere in the server's home (its log and database included) but the admin
    # token's own file, in the agents' logs, or on the agent hosts but in agent.json
    admin = (farm.home / "token").read_text().strip()
    secrets = {"join token": token, "fresh join token": fresh["token"], "admin token": admin,
               **{f"credential of {n}": c["credential"] for n, c in creds.items()}}
    assert (farm.home / "server.log").stat().st_size > 100
    assert list(farm.home.glob("batchyard.db*"))
    places = [p for p in farm.home.rglob("*") if p.is_file() and p.name != "token"]
    places += list(farm.work.glob("agent-*.log"))
    leaks = [f"{what} in {path}" for path in places for what, secret in secrets.items()
             if secret.encode() in path.read_bytes()]
    for h in farm.agents:
        argv = ["grep", "-rlF", "--exclude=agent.json"]
        for secret in secrets.values():
            argv += ["-e", secret]
        found = h.run([*argv, "/var/lib/batchyard"], timeout=30)
        assert found.returncode in (0, 1), show(found)
        leaks += [f"a secret in {h.name}:{path}" for path in found.stdout.split()]
    assert not leaks, leaks


SCRAPE_PY = r'''
import os, sys
import httpx
from batchyard.client.http import verify_for
url = sys.argv[1] + "/metrics"
verify = verify_for(sys.argv[1])
print(httpx.get(url, verify=verify, timeout=30).status_code)
answer = httpx.get(url, verify=verify, timeout=30,
                   headers={"Authorization": "Bearer " + sys.argv[2]})
print(answer.status_code)
print(answer.text)
'''


def test_metrics_see_idle_machines_behind_the_scrape_token(farm: Farm) -> None:
    """Beyond loopback /metrics needs the scrape token; each joined machine's own sample
    (its agent's, sent with heartbeats) shows there with no job running on it (issue 38)."""
    token = farm.ok("server", "token", "--scrape").strip()
    found: dict[str, str] = {}

    def sampled() -> bool:
        res = farm.server.run([PY, "-c", SCRAPE_PY, farm.url, token], env=farm.env,
                              timeout=60, cwd=farm.work)
        assert res.returncode == 0, show(res)
        lines = res.stdout.splitlines()
        found.update(anonymous=lines[0], status=lines[1], text="\n".join(lines[2:]))
        return all(re.search(r'batchyard_node_cpu_utilization_percent\{[^}]*node="'
                             + host.name + r'"', found["text"]) for host in farm.agents)

    wait_until(sampled, 60, 1.0, "every machine's sample in /metrics")
    assert found["anonymous"] == "401" and found["status"] == "200"
    assert re.search(r'batchyard_node_memory_utilization_percent\{[^}]*node="host1"[^}]*\} '
                     r'[1-9]', found["text"]), found["text"][-3000:]
