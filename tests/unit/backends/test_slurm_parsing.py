"""Slurm's JSON and the batch script, as pure functions: node and job parsing (on JSON captured
from a real Slurm 22.05 where a sample exists), host lists, Gres, pending reasons, and the
sbatch script that `--dry-run` prints and `launch` submits."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from batchyard.backends import slurm_cli
from batchyard.backends.base import Gang, NodeInfo
from batchyard.backends.slurm import (
    SlurmBackend,
    job_name,
    render_script,
    submit_environ,
    time_limit,
)
from batchyard.spec.cluster import ClusterSpec

DATA = Path(__file__).parent / "data"


def _sample(name: str) -> dict | None:
    path = DATA / name
    return json.loads(path.read_text()) if path.is_file() else None


@pytest.mark.parametrize(("text", "names"), [
    ("sn1", ["sn1"]),
    ("sn[1-3]", ["sn1", "sn2", "sn3"]),
    ("sn[1-2,5],gpu01", ["sn1", "sn2", "sn5", "gpu01"]),
    ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
    ("a[1-2]-ib,b3", ["a1-ib", "a2-ib", "b3"]),
    ("", []),
])
def test_expand_hostlist(text: str, names: list[str]) -> None:
    assert slurm_cli.expand_hostlist(text) == names


@pytest.mark.parametrize(("gres", "gpus"), [
    ("gpu:2", 2), ("gpu:a100:4(S:0-1)", 4), ("gpu:1,shard:4", 1), ("", 0), (None, 0),
    ("gpu:tesla:2,gpu:k80:1", 3), ("mps:100", 0),
])
def test_gres_gpus(gres: str | None, gpus: int) -> None:
    assert slurm_cli.gres_gpus(gres) == gpus


def test_nodes_parse_states_and_reasons() -> None:
    data = {"nodes": [
        {"name": "sn1", "address": "10.9.0.2", "cpus": 4, "real_memory": 4000,
         "gres": "gpu:1", "state": "idle", "state_flags": [], "reason": "",
         "partitions": ["debug", "wide"]},
        {"name": "sn2", "address": "10.9.0.3", "cpus": {"set": True, "number": 8},
         "real_memory": 8000, "gres": "", "state": ["IDLE", "DRAIN"], "reason": "bad dimm",
         "partitions": ["wide"]},
        {"name": "sn3", "address": "10.9.0.4", "cpus": 4, "real_memory": 4000, "gres": "",
         "state": "down", "state_flags": ["NOT_RESPONDING"], "reason": "Not responding",
         "partitions": "debug"},
    ]}
    nodes = slurm_cli.parse_nodes(data)
    assert [(n.name, n.address, n.cpus, n.gpus) for n in nodes] == [
        ("sn1", "10.9.0.2", 4, 1), ("sn2", "10.9.0.3", 8, 0), ("sn3", "10.9.0.4", 4, 0)]
    assert nodes[0].usable and not nodes[1].usable and not nodes[2].usable
    assert nodes[1].why_unusable == "Slurm node IDLE+DRAIN: bad dimm"
    assert "Not responding" in nodes[2].why_unusable
    assert nodes[2].partitions == ("debug",)


def test_jobs_parse_pending_and_running() -> None:
    data = {"jobs": [
        {"job_id": 7, "name": "by-x-1234", "job_state": "PENDING", "state_reason": "Resources",
         "nodes": "", "batch_host": "", "comment": "batchyard-attempt-u1"},
        {"job_id": 8, "name": "by-y", "job_state": "RUNNING", "state_reason": "None",
         "nodes": "sn[1-2]", "batch_host": "sn1",
         "job_resources": {"allocated_nodes": [{"nodename": "sn1"}, {"nodename": "sn2"}]}},
        {"job_id": {"set": True, "number": 9}, "job_state": ["NODE_FAIL"], "nodes": "sn3"},
    ]}
    pending, running, failed = slurm_cli.parse_jobs(data)
    assert pending.state == "PENDING" and pending.alive and not pending.started
    assert pending.pending_text() == ("Slurm job 7 pending: Resources (the nodes it needs "
                                      "are busy)")
    assert running.started and running.nodes == ("sn1", "sn2")
    assert failed.job_id == 9 and not failed.alive and failed.nodes == ("sn3",)


def test_pending_reason_words_stay_visible() -> None:
    job = slurm_cli.SlurmJob(1, "j", ("PENDING",), "ReqNodeNotAvail, UnavailableNodes:sn2",
                             (), "")
    text = job.pending_text()
    assert "ReqNodeNotAvail, UnavailableNodes:sn2" in text and "down, drained" in text
    odd = slurm_cli.SlurmJob(2, "j", ("PENDING",), "SomethingNew", (), "")
    assert odd.pending_text() == "Slurm job 2 pending: SomethingNew"


def test_parse_job_id() -> None:
    assert slurm_cli.parse_job_id("1234\n") == 1234
    assert slurm_cli.parse_job_id("77;cluster1") == 77
    with pytest.raises(Exception, match="not a job id"):
        slurm_cli.parse_job_id("sbatch: error: Batch job submission failed")


@pytest.mark.parametrize("name", ["slurm_nodes.json", "slurm_nodes_down.json"])
def test_real_node_samples(name: str) -> None:
    data = _sample(name)
    assert data is not None, f"the {name} sample is missing from {DATA}"
    nodes = slurm_cli.parse_nodes(data)
    assert nodes and all(n.name and n.address and n.cpus >= 1 for n in nodes)
    assert all(n.partitions for n in nodes)
    if name == "slurm_nodes_down.json":
        assert any(not n.usable and n.why_unusable for n in nodes)


@pytest.mark.parametrize("name", ["slurm_squeue_pending.json", "slurm_squeue_running.json"])
def test_real_squeue_samples(name: str) -> None:
    data = _sample(name)
    assert data is not None, f"the {name} sample is missing from {DATA}"
    jobs = slurm_cli.parse_jobs(data)
    assert jobs and all(j.job_id > 0 for j in jobs)
    if "pending" in name:
        waiting = [j for j in jobs if j.state == "PENDING"]
        assert waiting and all(j.reason for j in waiting)
    else:
        assert any(j.started and j.nodes for j in jobs)


def _gang(**spec_extra: object) -> Gang:
    cluster = ClusterSpec.model_validate({
        "name": "hpc", "backend": "slurm",
        "slurm": {"partition": "debug", "account": "ml", "qos": "normal",
                  "options": {"mem": "16G", "exclusive": ""}, "work_dir": "/scratch/by"}})
    return Gang(
        job_id=1, job_name="train", workspace="ws", experiment="exp", attempt=1,
        attempt_uuid="0123abcd-0000-4000-8000-000000000000", attempt_dir="/x",
        checkpoint_dir="", spec={"nodes": 2, "limits": {"max_wall_clock": 3600,
                                                        "grace_period": 30}, **spec_extra},
        nodes=[], server_url="https://10.0.0.1:8742", launch_tokens=["launch.a", "launch.b"],
        nodes_wanted=2, cluster_spec=cluster.model_dump(mode="json"),
        cluster_size={"vcpus": 6, "gpus": 1})


def test_script_has_the_sbatch_contract() -> None:
    gang = _gang()
    script = render_script(gang)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for want in ("--job-name=by-train-0123abcd", "--partition=debug", "--nodes=2",
                 "--ntasks-per-node=1", "--cpus-per-task=6", "--gres=gpu:1", "--time=63",
                 "--output=/dev/null", "--no-requeue", "--account=ml",
                 "--qos=normal", "--mem=16G", "--export=ALL"):
        assert f"#SBATCH {want}" in lines, want
    assert "#SBATCH --exclusive" in lines
    # the job's environment is what the script says (sbatch runs with Slurm's variables
    # only, see test_sbatch_runs_with_slurms_variables_only), never the login shell's
    assert not any("--export=NONE" in line or "get-user-env" in line for line in lines)
    exported = {line.split("=", 1)[0].removeprefix("export ") for line in lines
                if line.startswith("export ")}
    assert {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PYTHONPATH",
            "BATCHYARD_LAUNCHER"} <= exported, exported
    assert 'exec >>/scratch/by/slurm-"$SLURM_JOB_ID".out 2>&1' in lines
    srun = next(line for line in lines if line.startswith("srun "))
    assert "--input=all" in srun and "batchyard.node.slurm /scratch/by" in srun
    bundle = json.loads(lines[lines.index(srun) + 1])
    assert bundle["tickets"] == ["launch.a", "launch.b"]
    assert bundle["server"] == "https://10.0.0.1:8742"
    masked = render_script(gang, mask=True)
    assert "launch.a" not in masked and "***" in masked
    assert masked.replace('"***","***"', '"launch.a","launch.b"') == script


def test_script_is_valid_bash() -> None:
    proc = subprocess.run(["bash", "-n"], input=render_script(_gang()), text=True,
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr


def test_time_limit_and_name() -> None:
    gang = _gang()
    assert time_limit(gang) == "63"  # 3600 + 30 grace + 120 margin, in minutes
    gang.spec["limits"] = {}
    assert time_limit(gang) is None
    assert job_name(gang) == "by-train-0123abcd"


def test_own_options_are_refused() -> None:
    with pytest.raises(ValueError, match="--nodes is set by batchyard"):
        ClusterSpec.model_validate({"name": "h", "backend": "slurm",
                                    "slurm": {"options": {"nodes": "3"}}})
    with pytest.raises(ValueError, match="Slurm owns its nodes"):
        ClusterSpec.model_validate({"name": "h", "backend": "slurm",
                                    "autoscale": {"min_nodes": 0, "max_nodes": 3}})


class _Refusing(BaseHTTPRequestHandler):
    """A server that refuses every call (403), noting what was asked of it."""

    asked: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        self.asked.append((self.path, self.headers.get("Authorization", "")))
        body = b'{"error": {"message": "refused"}}'
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_node_entry_picks_its_ticket(tmp_path: Path) -> None:
    """The srun'ed entry takes the ticket of SLURM_NODEID from stdin, writes it 0600 and
    never leaves the tickets in its environment; it runs the launcher itself (no second
    interpreter), whose plan request names the Slurm allocation: the start callback."""
    _Refusing.asked.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        bundle = {"server": f"http://127.0.0.1:{server.server_port}", "attempt": "u1",
                  "tickets": ["t0", "t1"], "ca_pem": "-----BEGIN CERTIFICATE-----\n"}
        env = {"SLURM_NODEID": "1", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "sn[1-2]",
               "SLURMD_NODENAME": "sn2", "PATH": "/usr/bin:/bin",
               "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")}
        proc = subprocess.run([sys.executable, "-S", "-m", "batchyard.node.slurm",
                               str(tmp_path)], input=json.dumps(bundle) + "\n", text=True,
                              capture_output=True, env=env, timeout=60)
    finally:
        server.shutdown()
    ticket = tmp_path / "tickets" / "u1.1.json"
    assert ticket.is_file(), proc.stderr
    data = json.loads(ticket.read_text())
    assert data["token"] == "t1" and data["node_rank"] == 1
    assert data["ca_file"] and Path(data["ca_file"]).read_text().startswith("-----BEGIN")
    assert data["allocation"] == {"job": "77", "nodes": "sn[1-2]", "node": "sn2"}
    assert ticket.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "tickets" / "u1.0.json").exists()
    assert proc.returncode != 0 and "HTTP 403" in proc.stderr, proc.stderr
    assert _Refusing.asked == [("/api/v1/node/attempts/u1/nodes/1/plan?job=77&nodes=sn%5B1-2%5D"
                                "&node=sn2", "Bearer t1")], _Refusing.asked


def test_node_entry_refuses_a_node_without_ticket(tmp_path: Path) -> None:
    bundle = {"server": "http://127.0.0.1:9", "attempt": "u1", "tickets": ["t0"]}
    env = {"SLURM_NODEID": "3", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")}
    proc = subprocess.run([sys.executable, "-S", "-m", "batchyard.node.slurm",
                           str(tmp_path)], input=json.dumps(bundle) + "\n", text=True,
                          capture_output=True, env=env, timeout=60)
    assert proc.returncode == 2 and "SLURM_NODEID 3 has no ticket (1 nodes)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_sbatch_runs_with_slurms_variables_only() -> None:
    """Under --export=ALL the job inherits sbatch's environment: the server's own (its home,
    its credentials) must not be in it, and nothing may bring the login shell back."""
    server = {"SLURM_CONF": "/etc/slurm/slurm.conf", "SBATCH_ACCOUNT": "ml",
              "SBATCH_EXPORT": "NONE", "SBATCH_GET_USER_ENV": "1", "HOME": "/root",
              "BATCHYARD_HOME": "/srv/by", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "PATH": "/x"}
    assert submit_environ(server) == {"SLURM_CONF": "/etc/slurm/slurm.conf",
                                      "SBATCH_ACCOUNT": "ml"}


class _FakeSlurm:
    """sbatch and squeue as calls noted (pure logic of the backend's launch)."""

    def __init__(self, queued: list[slurm_cli.SlurmJob]) -> None:
        self.queued = queued
        self.calls: list[str] = []
        self.env: dict[str, str] | None = None

    def jobs(self, *args: object, **kwargs: object) -> list[slurm_cli.SlurmJob]:
        self.calls.append("squeue")
        return self.queued

    def submit(self, script: str, test_only: bool = False,
               env: dict[str, str] | None = None) -> int:
        self.calls.append("sbatch")
        self.env = env
        return 4242


def test_launch_submits_at_once_and_looks_only_after_a_crash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gang = _gang()
    mine = slurm_cli.SlurmJob(17, job_name(gang), ("PENDING",), "Priority", (), "",
                              comment=f"batchyard-attempt-{gang.attempt_uuid}")
    fake = _FakeSlurm([mine])
    monkeypatch.setattr(slurm_cli, "jobs", fake.jobs)
    monkeypatch.setattr(slurm_cli, "submit", fake.submit)
    monkeypatch.setenv("BATCHYARD_TOKEN_PROBE", "x")
    handle = SlurmBackend().launch(gang)
    assert fake.calls == ["sbatch"] and handle["slurm_job_id"] == 4242
    assert fake.env is not None and "BATCHYARD_TOKEN_PROBE" not in fake.env
    # a launch that may have been made before: the job it submitted is found, not resubmitted
    fake.calls.clear()
    gang.maybe_submitted = True
    assert SlurmBackend().launch(gang)["slurm_job_id"] == 17
    assert fake.calls == ["squeue"]
    fake.queued = []
    assert SlurmBackend().launch(gang)["slurm_job_id"] == 4242
    assert fake.calls == ["squeue", "squeue", "sbatch"]


def test_started_from_a_launchers_allocation() -> None:
    backend = SlurmBackend()
    handle = {"slurm_job_id": 77, "nodes_wanted": 2}
    got = backend.started_from(handle, 1, {"job": "77", "nodes": "sn[1-2]", "node": "sn2"})
    assert got is not None and got.state == "running" and got.nodes == ("sn1", "sn2")
    assert got.external_id == "77"
    for rank, where in ((1, {"job": "78", "nodes": "sn[1-2]", "node": "sn2"}),  # another job
                        (1, {"job": "77", "nodes": "sn[1-3]", "node": "sn2"}),  # its size
                        (0, {"job": "77", "nodes": "sn[1-2]", "node": "sn2"}),  # its order
                        (1, {"job": "77", "nodes": "sn[x-2]", "node": "sn2"}),  # garbage
                        (1, {"job": "77", "nodes": "sn2,sn2", "node": "sn2"}),
                        (5, {"job": "77", "nodes": "sn[1-2]", "node": "sn2"})):
        assert backend.started_from(handle, rank, where) is None, where
    assert backend.started_from({"nodes_wanted": 2}, 1,
                                {"job": "", "nodes": "sn[1-2]", "node": "sn2"}) is None


def test_node_info_carries_unusable() -> None:
    info = NodeInfo("sn1", 0, "10.0.0.2", "/w", {}, unusable="Slurm node DOWN")
    assert info.unusable == "Slurm node DOWN"
