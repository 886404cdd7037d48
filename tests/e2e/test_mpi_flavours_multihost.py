"""MPI across two real (simulated) machines: examples/mnist-mpi under MPICH, and mpi4py's own
demo/compute-pi/cpi-rma.py (one-sided MPI.Win) under the hosts' Open MPI; a server host and two
agent hosts, each a network + UTS + mount namespace (tests/hostkit.py) with its own address,
a hostname resolving to 127.0.1.1 as on Debian, and a private work dir; a `--backend
machines` cluster. MPICH (PyPI's wheel, in the job's ``environment.python`` venv) starts on
node 0's host; its proxy on the other host comes through the relay (no ssh on any host's
PATH but a tripwire) and connects back to mpiexec over the hosts' network, not loopback.

Root only (namespaces): skipped elsewhere. Marked slow.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hostkit import Host, HostNet, require_root_netns
from mpikit import mpi4py_demo, mpi_venv
from sitekit import PY, Site, assert_nothing_left, example, rank_lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PORT = 18743
AGENT_WORK = "/var/lib/batchyard/agent"
CLUSTER = "pair"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[Site, list[Host], Path]]:
    """The server host, the two agent hosts, and the MPICH venv all hosts see."""
    require_root_netns()
    venv = mpi_venv("mpich")
    base = tmp_path_factory.mktemp("mpiflavours")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    trip = work / "tripwire"
    trip.mkdir()
    (trip / "ssh").write_text(f'#!/bin/sh\necho "$@" >> {trip}/ssh-called\nexit 255\n')
    (trip / "ssh").chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BATCHYARD_", "AZ_BATCHAI_", "AZ_BATCH_", "AZUREML_"))}
    env.update({"BATCHYARD_HOME": str(home), "NO_COLOR": "1", "TERM": "dumb",
                "COLUMNS": "250", "PYTHONUNBUFFERED": "1",
                "PATH": f"{trip}:{env.get('PATH', '/usr/bin:/bin')}"})
    with HostNet() as net:
        server = net.add_host("server")
        agents = [net.add_host(f"mpihost{i}", hide=[home]) for i in (1, 2)]
        url = f"https://{server.addr}:{PORT}"
        env["BATCHYARD_SERVER"] = url
        s = Site(net, server, home, work, env, url, PORT, CLUSTER)
        s.start_server()
        s.ok("cluster", "create", "-n", CLUSTER, "--backend", "machines", "-s",
             "Standard_D4_v2")
        line = s.js("cluster", "join-command", "-n", CLUSTER)["command"]
        argv = shlex.split(line)
        assert argv[:2] == ["batchyard", "agent"], argv
        agent_env = {k: v for k, v in env.items() if not k.startswith("BATCHYARD_")}
        for host in agents:
            with open(work / f"agent-{host.name}.log", "ab") as log:
                host.popen([PY, "-m", "batchyard.cli.main", *argv[1:], "--work-dir",
                            AGENT_WORK, "--name", host.name], env=agent_env, stdout=log,
                           stderr=subprocess.STDOUT)
        s.wait_nodes(2, ("idle",), timeout=60)
        yield s, agents, venv


def test_mnist_mpi_under_mpich_across_hosts(site: tuple[Site, list[Host], Path]) -> None:
    s, agents, venv = site
    folder = example(s, "mnist-mpi")
    # see tests/integration/test_mpi_flavours.py: MPICH's --version output outlasts `head`
    prep = folder / "jobprep.sh"
    prep.write_text(prep.read_text().replace("2>&1 | head -n 1", "2>&1 | sed -n 1p"))
    spec = yaml.safe_load((folder / "job.yaml").read_text())
    spec["distribution"]["processes_per_node"] = 2
    spec["command"] = spec["command"].replace("train_mpi.py", "train_mpi.py -e 5")
    spec["environment"] = {"python": str(venv / "bin" / "python")}
    spec["mpi"] = {"flavour": "mpich"}
    job_file = folder / "job-mpich.yaml"
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    s.submit(job_file, "mpich", cwd=folder)
    job = s.wait_job("mpich", timeout=180)
    logs = s.logs("mpich")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-4000:]}"
    names = [n["node"] for n in job["attempts"][-1]["nodes"]]
    hosts = [next(h for h in agents if h.name == n) for n in names]
    assert hosts[0] is not hosts[1]
    assert "MPI world size 4 (MPICH" in "\n".join(rank_lines(logs, 0)), logs[-3000:]
    assert re.search(r"test accuracy: 0\.9", logs), logs[-3000:]
    files = [f["path"] for f in s.js("job", "file", "list", "-n", "mpich")["files"]]
    for rank in range(4):  # each MPI rank's own log files, ranks 0-1 on node 0's host
        assert f"stdouterr/{names[rank // 2]}-rank{rank}.stdout.txt" in files, files
    assert "outputs/MODEL/model.npz" in files, files
    # node 1's proxy came through the relay to its own host's launcher
    node1 = hosts[1].run(["sh", "-c", f"find {AGENT_WORK} -path '*/jobs/mpich/*/.batchyard/"
                          "node-1.status.json' -exec cat {} +"])
    assert '"execs": {"1-' in node1.stdout, node1
    called = s.work / "tripwire" / "ssh-called"
    assert not called.exists(), called.read_text()
    assert_nothing_left(hosts, job)


def test_cpi_rma_under_open_mpi_across_hosts(site: tuple[Site, list[Host], Path]) -> None:
    """mpi4py's cpi-rma.py, unchanged, 2 hosts x 2 ranks under Open MPI (the hosts' mpirun
    and the interpreter batchyard runs on): its windows span both hosts (it failed with
    MPI_ERR_WIN while the launcher forced --mca btl self,tcp)."""
    s, agents, _venv = site
    job_file = s.write_job("cpi-rma", {
        "nodes": 2, "distribution": {"type": "mpi", "processes_per_node": 2},
        "mpi": {"flavour": "openmpi"}, "code": ".",
        "command": "printf '100000\\n' | python cpi-rma.py"},
        files={"cpi-rma.py": mpi4py_demo("compute-pi/cpi-rma.py")})
    s.submit(job_file, "cpi-rma")
    job = s.wait_job("cpi-rma", timeout=180)
    logs = s.logs("cpi-rma")
    assert job["state"] == "succeeded", f"{job['message']}\n{logs[-4000:]}"
    names = [n["node"] for n in job["attempts"][-1]["nodes"]]
    assert len({next(h for h in agents if h.name == n).addr for n in names}) == 2, names
    found = re.search(r"pi is approximately (\d\.\d+), error is (\d\.\d+)",
                      "\n".join(rank_lines(logs, 0)))
    assert found and float(found[2]) < 1e-9, logs[-3000:]
    called = s.work / "tripwire" / "ssh-called"
    assert not called.exists(), called.read_text()
    hosts = [next(h for h in agents if h.name == n) for n in names]
    assert_nothing_left(hosts, job)
