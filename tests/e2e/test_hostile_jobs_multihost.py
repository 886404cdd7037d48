"""Jobs cannot escape (issue 32) on an agent node: a server host and an agent host (network +
mount namespaces, tests/hostkit.py), a `--backend machines` cluster. The hostile job of the
local suite (tests/hostilekit.py) runs on the agent's node: every try fails, the node's own
credential (the agent's agent.json) cannot be read nor linked into an output, its own
checkpoint, outputs, metrics and logs still work, and it ran as an unprivileged uid.

Root only (namespaces): skipped elsewhere. Marked slow."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hostilekit import ATTACK, MUST_FAIL
from hostkit import Host, HostNet, require_root_netns
from sitekit import PY, Site, download
from yardkit import cli_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PORT = 18762
AGENT_WORK = "/var/lib/batchyard/agent"
CLUSTER = "far"


@dataclass
class Farm(Site):
    agent: Host | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    require_root_netns()
    base = tmp_path_factory.mktemp("hostile-multihost")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    env = cli_env(home)
    with HostNet() as net:
        server = net.add_host("server")
        agent = net.add_host("agent1", hide=[home])
        url = f"https://{server.addr}:{PORT}"
        env["BATCHYARD_SERVER"] = url
        f = Farm(net, server, home, work, env, url, PORT, CLUSTER, agent=agent)
        f.start_server()
        f.ok("cluster", "create", "-n", CLUSTER, "--backend", "machines", "-s",
             "Standard_D2_v2")
        line = f.js("cluster", "join-command", "-n", CLUSTER)["command"]
        argv = shlex.split(line)
        agent_env = {k: v for k, v in env.items() if not k.startswith("BATCHYARD_")}
        with open(work / "agent.log", "ab") as log:
            f.procs.append(agent.popen([PY, "-m", "batchyard.cli.main", *argv[1:],
                                        "--work-dir", AGENT_WORK, "--name", agent.name],
                                       env=agent_env, stdout=log, stderr=subprocess.STDOUT))
        try:
            f.wait_nodes(1, ("idle",), timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{(work / 'agent.log').read_text()[-3000:]}") \
                from None
        yield f


@pytest.fixture(scope="module")
def attack(farm: Farm) -> dict[str, Any]:
    assert farm.agent is not None
    cred = f"{AGENT_WORK}/agent.json"
    assert farm.agent.run(["test", "-s", cred]).returncode == 0  # it is there, on the host
    path = farm.write_job("attack", {
        "code": ".", "command": "python attack.py", "distribution": {"type": "custom"},
        "outputs": {"OUT": {}, "EVIL": {}},
        "env": {"ATTACK_HOME": str(farm.home), "NODE_CRED": cred}},
        files={"attack.py": ATTACK})
    farm.submit(path, "attack")
    job = farm.wait_job("attack", timeout=120)
    logs = farm.logs("attack")
    assert job["state"] == "succeeded", (job, logs)
    dest = download(farm, "attack", "outputs/OUT")
    report = json.loads((dest / "outputs" / "OUT" / "report.json").read_text())
    launcher = farm.agent.run(["sh", "-c", f"cat {AGENT_WORK}/workspaces/*/experiments/*/"
                               "jobs/attack/*/stdouterr/*-launcher.txt"]).stdout
    return {"job": job, "report": report, "logs": logs, "dest": dest, "launcher": launcher,
            "credential": json.loads(farm.agent.run(["cat", cred]).stdout)["credential"]}


def test_every_try_fails_on_the_agent_node(attack: dict[str, Any]) -> None:
    report = attack["report"]
    done = {k: v for k, v in report.items() if k in MUST_FAIL
            and not str(v).startswith("refused")}
    assert done == {}, json.dumps(report, indent=1)
    assert report["uid"] >= 1_600_000_000 and report["user"] == "by-root", report


def test_the_node_credential_never_leaves(farm: Farm, attack: dict[str, Any]) -> None:
    credential = attack["credential"]
    assert credential.startswith("node."), "agent.json holds no node credential"
    dest: Path = attack["dest"]
    assert sorted(p.name for p in (dest / "outputs" / "OUT").iterdir()) == [
        "model.txt", "report.json"]
    for text in (attack["logs"], json.dumps(attack["job"]), json.dumps(attack["report"])):
        assert credential not in text
    assert "cred -> /var/lib/batchyard/agent/agent.json" in attack["launcher"], \
        attack["launcher"]


def test_its_own_things_work_on_the_agent_node(farm: Farm, attack: dict[str, Any]) -> None:
    assert (attack["dest"] / "outputs" / "OUT" / "model.txt").read_text() == "weights\n"
    assert "hostile job done" in attack["logs"]
    metrics = farm.api("get", "/workspaces/default/experiments/default/jobs/attack/metrics")
    assert metrics["status"] == 200 and "steps" in json.dumps(metrics["body"]), metrics
    assert farm.agent is not None
    step = farm.agent.run(["sh", "-c", f"cat {AGENT_WORK}/workspaces/*/experiments/*/jobs/"
                           "attack/checkpoints/step.txt"])
    assert step.stdout == "7", step
