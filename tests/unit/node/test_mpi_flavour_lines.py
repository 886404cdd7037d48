"""MPI flavours at the node, offline: which MPI an ``mpirun --version`` names (real outputs of
Open MPI 4.1.4 from Debian, MPICH 5.0.2 from PyPI's ``mpich`` wheel, Intel MPI 2021.18.1
from PyPI's ``impi-rt`` wheel, all captured on this machine), the hostfile each reads, the
mpiexec line and environment of Hydra (MPICH, Intel MPI) next to Open MPI's unchanged one,
and the relay agent taking Hydra's launcher arguments. Jobs that really run under each
flavour are in tests/integration/test_mpi_flavours.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import strictkit
from batchyard.launchplan import Ticket
from batchyard.node.env import node_dirs, node_env
from batchyard.node.launcher import write_rsh_agent
from batchyard.node.mpi import (
    HYDRA_RANK_SHIM,
    RANK_SHIM,
    detect_flavour,
    flavour_of,
    hostfile_lines,
    job_mpirun,
    mpirun_argv,
    resolve_flavour,
)
from batchyard.node.plan import AttemptPaths, NodePlan

OPENMPI = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
MPICH = """\
HYDRA build details:
    Version:                                 5.0.2
    Release Date:                            Fri Sep 25 20:45:26 UTC 2026
    CC:                              cc
    Configure options:                       --with-device=ch4:ucx,ofi --with-pm=hydra:gforker
    Process Manager:                         pmi
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
    Topology libraries available:            hwloc
    Resource management kernels available:   user slurm ll lsf sge pbs cobalt
    Demux engines available:                 poll select
"""
INTELMPI = ("Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 "
            "(id: b44796a)\nCopyright 2003-2026, Intel Corporation.\n")
AGENT = "/n/attempt/.batchyard/rsh-agent"


def _plan(tmp_path: Path, flavour: str | None = None, addrs: tuple[str, str] = (
        "127.0.0.1", "127.0.0.1"), **changes: Any) -> NodePlan:
    dist: dict[str, Any] = {"type": "mpi", "processes_per_node": 2}
    if flavour:
        dist["mpi_flavour"] = flavour
    plan = NodePlan(job_id=1, job_name="j", workspace="w", experiment="e", attempt=1,
                    attempt_uuid="u" * 32, node_rank=0, node_names=["local2-0", "local2-1"],
                    node_addrs=list(addrs), distribution=dist, command="python train.py -o x",
                    prepare=None, attempt_dir=str(tmp_path / "a"), node_dir=str(tmp_path / "n"),
                    checkpoint_dir=str(tmp_path / "c"), master_addr=addrs[0], master_port=29500,
                    rsh_agent=[AGENT], cpus=4)
    for key, value in changes.items():
        setattr(plan, key, value)
    return plan


# --- which MPI -----------------------------------------------------------------------------


@pytest.mark.parametrize("text,flavour", [(OPENMPI, "openmpi"), (MPICH, "mpich"),
                                          (INTELMPI, "intelmpi"), ("", None),
                                          ("bash: mpirun: command not found", None)])
def test_flavour_of_real_version_outputs(text: str, flavour: str | None) -> None:
    assert flavour_of(text) == flavour


def test_detect_defaults_to_open_mpi_when_mpirun_cannot_say(tmp_path: Path) -> None:
    def missing(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(argv[0])

    def hangs(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    def answers(text: str) -> Any:
        return lambda argv, **_: subprocess.CompletedProcess(argv, 0, text, "")

    assert detect_flavour("mpirun", missing) == "openmpi"
    assert detect_flavour("mpirun", hangs) == "openmpi"
    assert detect_flavour("mpirun", answers("some other MPI 1.0")) == "openmpi"
    assert detect_flavour("mpirun", answers(MPICH)) == "mpich"
    assert detect_flavour(str(tmp_path / "no-such-mpirun")) == "openmpi"  # really run


@strictkit.requires(shutil.which("mpirun") is None, "no mpirun on this host")
def test_detect_runs_the_hosts_mpirun() -> None:
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    assert detect_flavour("mpirun") == (flavour_of(version) or "openmpi")


def test_resolve_prefers_the_job_and_records_what_it_found(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def mpich(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, MPICH, "")

    given = _plan(tmp_path, "intelmpi")
    assert resolve_flavour(given, run=mpich) == "intelmpi" and not calls
    later = _plan(tmp_path)  # in a container: asked again inside the image, not on the host
    assert resolve_flavour(later, run=mpich, detect=False) == "openmpi" and not calls
    assert "mpi_flavour" not in later.distribution
    found = _plan(tmp_path)
    assert resolve_flavour(found, mpirun="mpirun", run=mpich) == "mpich"
    assert calls == [["mpirun", "--version"]]
    assert found.distribution["mpi_flavour"] == "mpich"
    assert mpirun_argv(found)[1:3] == ["-launcher", "rsh"]  # what was found is what runs


def test_the_jobs_own_mpirun_comes_first(tmp_path: Path) -> None:
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    for name in ("python", "mpirun"):
        (venv / name).write_text("#!/bin/sh\n")
        (venv / name).chmod(0o755)
    assert job_mpirun(_plan(tmp_path, python=str(venv / "python"))) == str(venv / "mpirun")
    boxed = _plan(tmp_path, python=str(venv / "python"), container={"image": "img:1"})
    assert job_mpirun(boxed) == "mpirun"  # found on the image's PATH, inside it


# --- hostfiles -----------------------------------------------------------------------------


def test_each_flavour_gets_its_hostfile(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert hostfile_lines(plan, "openmpi") == ["local2-0 slots=2", "local2-1 slots=2"]
    assert hostfile_lines(plan) == ["local2-0 slots=2", "local2-1 slots=2"]
    for flavour in ("mpich", "intelmpi"):
        assert hostfile_lines(plan, flavour) == ["local2-0:2", "local2-1:2"]
        assert hostfile_lines(_plan(tmp_path, flavour)) == ["local2-0:2", "local2-1:2"]


# --- the mpirun line -----------------------------------------------------------------------


def test_open_mpi_line_is_the_default(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    argv = mpirun_argv(plan, mpirun="/usr/bin/mpirun")
    assert argv == mpirun_argv(_plan(tmp_path, "openmpi"), mpirun="/usr/bin/mpirun")
    assert argv[0] == "/usr/bin/mpirun" and "--hostfile" in argv and "-launcher" not in argv
    assert argv[argv.index("plm_rsh_agent") + 1] == AGENT
    assert argv[-5:] == ["bash", "-c", RANK_SHIM, "batchyard-mpi-rank", "python train.py -o x"]


@pytest.mark.parametrize("flavour", ["mpich", "intelmpi"])
def test_hydra_line(tmp_path: Path, flavour: str) -> None:
    plan = _plan(tmp_path, flavour, distribution={
        "type": "mpi", "processes_per_node": 2, "process_count": 3, "mpi_flavour": flavour,
        "mpirun_args": ["-prepend-rank"]})
    hostfile = str(node_dirs(plan).hostfile)
    argv = mpirun_argv(plan, mpirun="mpirun")
    assert argv == ["mpirun", "-launcher", "rsh", "-launcher-exec", AGENT, "-f", hostfile,
                    "-n", "3", "-ppn", "2", "-genvnone", "-wdir", "/", "-iface", "lo",
                    "-prepend-rank",
                    "bash", "-c", HYDRA_RANK_SHIM, "batchyard-mpi-rank",
                    "python train.py -o x"]
    # across machines: node 0's own interface (its hostname may resolve to 127.0.1.1)
    far = _plan(tmp_path, flavour, addrs=("10.1.0.2", "10.1.0.3"), ifname="eth0")
    assert mpirun_argv(far)[mpirun_argv(far).index("-iface") + 1] == "eth0"


def test_inside_a_slurm_job_hydra_takes_the_gangs_hosts(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    plan = _plan(tmp_path, "mpich")
    argv = mpirun_argv(plan, mpirun="mpirun")
    assert argv[argv.index("-rmk") + 1] == "user"
    env = node_env(plan, node_dirs(plan))
    assert env["HYDRA_RMK"] == env["I_MPI_HYDRA_RMK"] == "user"


def test_rank_shims_name_ranks_and_end_failed_hydra_ranks_by_signal(tmp_path: Path) -> None:
    """Run the shims for real: the rank's own log files and exit file, by PMI_RANK (Hydra)
    or OMPI_COMM_WORLD_RANK; a failed rank under Hydra ends by SIGTERM, its code kept."""
    stdouterr = tmp_path / "stdouterr"
    stdouterr.mkdir()
    env = {"PATH": os.environ["PATH"], "AZ_BATCHAI_STDOUTERR_DIR": str(stdouterr),
           "BATCHYARD_NODE_NAME": "local2-1", "BATCHYARD_JOB_DIR": str(tmp_path)}
    cases = [  # shim, its rank variable, rank, user command, shim's exit status, recorded
        (RANK_SHIM, "OMPI_COMM_WORLD_RANK", "1", "echo hi; exit 3", 3, "3"),
        (HYDRA_RANK_SHIM, "PMI_RANK", "2", "echo hi; exit 4", -15, "4"),
        (HYDRA_RANK_SHIM, "PMI_RANK", "3", "echo hi", 0, "0")]
    for shim, rank_var, rank, user, status, recorded in cases:
        done = subprocess.run(["bash", "-c", shim, "batchyard-mpi-rank", user],
                              env={**env, rank_var: rank}, timeout=30)
        assert done.returncode == status
        assert (stdouterr / f"local2-1-rank{rank}.stdout.txt").read_text() == "hi\n"
        exit_file = tmp_path / ".batchyard" / "mpi" / f"rank-{rank}.exit"
        assert exit_file.read_text().split() == [recorded, "local2-1"]


# --- the environment of a user's own mpirun --------------------------------------------------


def test_open_mpi_env_unchanged(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    env = node_env(plan, node_dirs(plan))
    assert env["OMPI_MCA_plm_rsh_agent"] == AGENT
    assert env["AZ_BATCHAI_MPI_HOST_FILE"] == str(node_dirs(plan).hostfile)
    # no btl list (self,tcp broke one-sided windows): only TCP's interface is named
    assert "OMPI_MCA_btl" not in env
    assert env["OMPI_MCA_btl_tcp_if_include"] == env["OMPI_MCA_oob_tcp_if_include"] == "lo"
    assert not [k for k in env if k.startswith(("HYDRA_", "I_MPI_"))]


@pytest.mark.parametrize("flavour", ["mpich", "intelmpi"])
def test_hydra_env_for_a_users_own_mpiexec(tmp_path: Path, flavour: str) -> None:
    plan = _plan(tmp_path, flavour, env={"I_MPI_PIN": "1"})
    hostfile = str(node_dirs(plan).hostfile)
    env = node_env(plan, node_dirs(plan))
    assert {k: env[k] for k in env if k.startswith(("HYDRA_", "I_MPI_"))} == {
        "HYDRA_LAUNCHER": "rsh", "HYDRA_LAUNCHER_EXEC": AGENT,
        "I_MPI_HYDRA_BOOTSTRAP": "rsh", "I_MPI_HYDRA_BOOTSTRAP_EXEC": AGENT,
        "HYDRA_HOST_FILE": hostfile, "I_MPI_HYDRA_HOST_FILE": hostfile, "HYDRA_ENV": "none",
        "I_MPI_PERHOST": "2", "I_MPI_HYDRA_BRANCH_COUNT": "-1", "HYDRA_IFACE": "lo",
        "I_MPI_HYDRA_IFACE": "lo",
        "I_MPI_PIN": "1"}  # the job's own setting wins over "0" (virtual nodes share cores)
    assert env["AZ_BATCHAI_MPI_HOST_FILE"] == hostfile
    assert not [k for k in env if k.startswith("OMPI_MCA_")]
    far = _plan(tmp_path, flavour, addrs=("10.1.0.2", "10.1.0.3"), ifname="eth0")
    env = node_env(far, node_dirs(far))
    assert env["HYDRA_IFACE"] == "eth0" and "I_MPI_PIN" not in env


# --- the relay agent takes Hydra's launcher arguments ----------------------------------------


class _Relay:
    """POST .../relay answers an id, GET .../relay/ID answers done with exit code 0."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _answer(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                owner.bodies.append(json.loads(self.rfile.read(
                    int(self.headers.get("Content-Length") or 0))))
                self._answer({"id": "1-1-abc", "node_rank": 1})

            def do_GET(self) -> None:
                self._answer({"done": True, "exit_code": 0})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def relay() -> Iterator[_Relay]:
    server = _Relay()
    yield server
    server.http.shutdown()


# What Hydra's rsh launcher passed its launcher-exec here (MPICH 5.0.2, Intel MPI 2021.18.1)
HYDRA_ARGV = ["local2-1", '"/venv/bin/hydra_pmi_proxy"', "--control-port", "127.0.0.1:41675",
              "--rmk", "user", "--launcher", "rsh", "--launcher-exec", AGENT, "--demux",
              "poll", "--pgid", "0", "--retries", "10", "--usize", "-1", "--pmi-port", "0",
              "--gpus-per-proc", "-2", "--gpu-subdevs-per-proc", "-2", "--proxy-id", "1"]
INTEL_ARGV = ["local2-1", "/venv/bin//hydra_bstrap_proxy", "--upstream-host", "127.0.0.1",
              "--upstream-port", "46629", "--pgid", "0", "--launcher", "rsh",
              "--launcher-number", "2", "--launcher-exec", AGENT, "--base-path", "/venv/bin/",
              "--tree-width", "16", "--tree-level", "1", "--time-left", "-1",
              "--launch-type", "2", "--proxy-id", "1", "--node-id", "1", "--subtree-size", "1",
              "/venv/bin//hydra_pmi_proxy", "--usize", "-1", "--auto-cleanup", "1",
              "--abort-signal", "9"]


@pytest.mark.parametrize("argv", [HYDRA_ARGV, INTEL_ARGV], ids=["mpich", "intelmpi"])
def test_the_agent_relays_hydras_proxy_command(tmp_path: Path, relay: _Relay,
                                               argv: list[str]) -> None:
    ticket = Ticket(server=relay.url, token="t", attempt="att", node_rank=0,
                    node_dir=str(tmp_path))
    from batchyard.node.channel import Channel
    from batchyard.node.relaysock import RelaySocket

    sock = RelaySocket(tmp_path / "attempt" / ".batchyard" / "rsh.sock", Channel(ticket),
                       lambda _m: None)
    agent = write_rsh_agent(AttemptPaths(tmp_path / "attempt"), sock.path)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    done = subprocess.run([str(agent), *argv], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    # the host, then the proxy's command for the node's shell, its quoting kept
    assert relay.bodies == [{"host": "local2-1", "command": " ".join(argv[1:])}]
