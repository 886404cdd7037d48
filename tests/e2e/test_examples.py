"""The examples really train, through the CLI, on a 2-node local cluster of 4 vCPU per node:
``examples/mnist-ddp`` (native YAML and AML v2 YAML), ``examples/mnist-mpi`` (native YAML and
the seed-000-shaped Batch AI job.json), ``examples/tf-config`` (YAML and job.json); a refused
Batch AI property; ``cluster diagnose`` over MPI and gloo; and (marked slow) ten clean runs in a
row of each training example: every rank exits 0, none dies with gloo's SIGABRT (DESIGN §7).

Every example folder is copied into the module's scratch dir first: Batch AI job files mount
``file://.`` folders and write logs and results there, never into the repository.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from yardkit import CLUSTER, Yard

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ACCURACY = re.compile(r"test accuracy: ([0-9.]+)")


@pytest.fixture(scope="module")
def cluster4(yard: Yard) -> str:
    """2 nodes x 4 vCPU: room for the MPI example's 4 ranks per node. Named like the cluster
    that job-aml.yml's ``compute: azureml:local2`` names."""
    yard.ok("cluster", "create", "-n", CLUSTER, "--cpus", "4", "-t", "2")
    yard.wait_cluster(CLUSTER, 2)
    return CLUSTER


def example(yard: Yard, name: str, tag: str = "") -> Path:
    """A fresh copy of examples/NAME (without anything earlier runs left in it)."""
    target = yard.work / "examples" / f"{name}{tag}"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(EXAMPLES / name, target,
                    ignore=shutil.ignore_patterns("outputs", "__pycache__", "*.pyc"))
    for leftover in ("logs", "result"):  # Batch AI mounts: start empty
        if (target / leftover).is_dir():
            shutil.rmtree(target / leftover)
            (target / leftover).mkdir()
    return target


def run(yard: Yard, job_file: Path, name: str, *extra: str, state: str = "succeeded",
        wait: bool = False, timeout: float = 400) -> dict[str, Any]:
    """``job create -f FILE`` (with ``--wait``: streaming its logs until it ends; without:
    polling the API, which is quicker), and the finished job as the API shows it."""
    result = yard.cli("job", "create", "-f", str(job_file), "-n", name, "-c", CLUSTER,
                      *(["--wait"] if wait else []), *extra, timeout=timeout)
    assert result.rc == 0 or (wait and state != "succeeded"), str(result)
    job = yard.wait_job(name, timeout=timeout)
    assert job["state"] == state, f"{job['state']}: {job.get('message')}\n{result}\n" + logs(
        yard, job)
    return job


def statuses(yard: Yard, job: dict[str, Any]) -> list[dict[str, Any]]:
    """What each node launcher last reported, as the API shows it."""
    return yard.node_reports(yard.job(job["name"], job["experiment"], job["workspace"]))


def stdouterr(yard: Yard, job: dict[str, Any]) -> Path:
    """The server's copy of every node's logs (stdOutErrPathPrefix may put them under a
    mount on the nodes: the launchers ship them from wherever they are)."""
    return yard.attempt_dir(job) / "stdouterr"


def logs(yard: Yard, job: dict[str, Any]) -> str:
    try:
        folder = stdouterr(yard, job)
    except (AssertionError, OSError):
        return ""
    return "".join(f"--- {p.name}\n{p.read_text()[-1500:]}\n"
                   for p in sorted(folder.glob("*.txt")))


def rank_exit_codes(yard: Yard, job: dict[str, Any]) -> dict[str, int]:
    """Exit code of every process the gang ran: launcher-started ranks (or mpirun), as the
    launchers reported them, and, for MPI jobs, each MPI rank as its shim recorded it on
    its node."""
    codes = {}
    for status in statuses(yard, job):
        for rank in status["ranks"]:
            codes[f"{status['node']}/{rank.get('what', 'rank')}{rank['rank']}"] = rank[
                "exit_code"]
    for node_dir in yard.node_attempt_dirs(yard.job(job["name"], job["experiment"],
                                                    job["workspace"])):
        for path in (node_dir / ".batchyard" / "mpi").glob("rank-*.exit"):
            codes[f"mpi/{path.stem}"] = int(path.read_text().split()[0])
    return codes


def assert_clean_exit(yard: Yard, job: dict[str, Any], ranks: int) -> None:
    codes = rank_exit_codes(yard, job)
    mpi = [k for k in codes if k.startswith("mpi/")]
    assert len(mpi) == ranks or len(codes) == ranks, codes
    assert set(codes.values()) == {0}, codes
    text = logs(yard, job)
    for bad in ("SIGABRT", "Aborted", "terminate called", "Traceback"):
        assert bad not in text, f"{bad!r} in the logs of {job['name']}\n{text}"


def accuracy(yard: Yard, job: dict[str, Any]) -> float:
    found = [float(m) for p in stdouterr(yard, job).glob("*.stdout.txt")
             for m in ACCURACY.findall(p.read_text())]
    assert len(found) == 1, (found, logs(yard, job))
    return found[0]


# --- examples/mnist-ddp ------------------------------------------------------------------------


def test_ddp_example_identical_parameters(yard, cluster4):
    folder = example(yard, "mnist-ddp")
    spec = (folder / "job.yaml").read_text()
    assert "command: python train.py --epochs 5\n" in spec
    job_file = folder / "job-hashes.yaml"
    job_file.write_text(spec.replace("--epochs 5", "--epochs 5 --write-param-hashes"))
    job = run(yard, job_file, "ddp")
    assert job["nodes"] == 2
    model = yard.attempt_dir(job) / "outputs" / "MODEL"
    hashes = {p.name: p.read_text().strip() for p in model.glob("params-rank*.sha256")}
    assert sorted(hashes) == [f"params-rank{r}.sha256" for r in range(4)], hashes
    assert len(set(hashes.values())) == 1, hashes  # every rank ends with the same parameters
    assert (model / "model.pt").stat().st_size > 1000
    assert accuracy(yard, job) > 0.9
    # logged through the SDK: a loss per epoch and the accuracy, as charts and `job metrics`
    metrics = yard.js("job", "metrics", "-n", "ddp", "--all", "-o", "json")
    names = [m["name"] for m in metrics]
    assert names.count("loss") == 5 and names.count("accuracy") == 1, metrics
    assert_clean_exit(yard, job, 4)
    # each rank ran on its node, 2 per node
    for rank, node in enumerate([f"{CLUSTER}-0"] * 2 + [f"{CLUSTER}-1"] * 2):
        assert (stdouterr(yard, job) / f"{node}-rank{rank}.stdout.txt").is_file()


def test_ddp_example_aml_v2_yaml(yard, cluster4):
    folder = example(yard, "mnist-ddp", "-aml")
    job = run(yard, folder / "job-aml.yml", "ddp-aml", wait=True)
    assert job["source_format"] == "aml" and job["nodes"] == 2
    models = list(yard.attempt_dir(job).glob("outputs/**/model.pt"))
    assert len(models) == 1, models
    assert accuracy(yard, job) > 0.9
    assert_clean_exit(yard, job, 4)


# --- examples/mnist-mpi ------------------------------------------------------------------------


def test_mpi_example_native_yaml(yard, cluster4):
    folder = example(yard, "mnist-mpi")
    job = run(yard, folder / "job.yaml", "mpi-yaml")
    folder_logs = stdouterr(yard, job)
    for rank in range(8):
        node = f"{CLUSTER}-{rank // 4}"
        assert (folder_logs / f"{node}-rank{rank}.stdout.txt").is_file(), rank
    text = (folder_logs / f"{CLUSTER}-0-rank0.stdout.txt").read_text()
    assert "MPI world size 8" in text
    assert (yard.attempt_dir(job) / "outputs" / "MODEL" / "model.npz").is_file()
    # job preparation ran on both nodes
    for node in (f"{CLUSTER}-0", f"{CLUSTER}-1"):
        assert "jobprep done" in (folder_logs / f"{node}-prepare.stdout.txt").read_text()
    assert accuracy(yard, job) > 0.9
    assert_clean_exit(yard, job, 8)


def test_mpi_example_seed000_job_json(yard, cluster4):
    """The Batch AI job.json shaped like seed 000's (chainerSettings, processCount 8,
    jobPreparation, file:// mounts, stdOutErrPathPrefix and outputDirectories under
    $AZ_BATCHAI_JOB_MOUNT_ROOT) is accepted verbatim: nothing needs --ignore."""
    folder = example(yard, "mnist-mpi", "-json")
    job = run(yard, folder / "job.json", "mpi-json", wait=True)
    assert job["nodes"] == 2 and job["source_format"] == "batchai"
    suffix = Path("default", "default", "mpi-json", job["attempts"][-1]["uuid"])
    # logs and the model landed in the mounted folders, as on Batch AI (and the server has
    # its own copy of every log)
    mounted = folder / "logs" / suffix / "stdouterr"
    for rank in range(8):
        name = f"{CLUSTER}-{rank // 4}-rank{rank}.stdout.txt"
        assert (mounted / name).is_file(), sorted(p.name for p in mounted.glob("*"))
        assert (stdouterr(yard, job) / name).read_bytes() == (mounted / name).read_bytes()
    models = list((folder / "result" / suffix / "outputs").glob("**/model.npz"))
    assert len(models) == 1, list((folder / "result").rglob("*"))
    assert "MPI world size 8" in (stdouterr(yard, job) / f"{CLUSTER}-0-rank0.stdout.txt"
                                  ).read_text()
    assert accuracy(yard, job) > 0.9
    assert_clean_exit(yard, job, 8)


# --- examples/tf-config ------------------------------------------------------------------------


@pytest.mark.parametrize("job_file,tasks", [("job.yaml", 4), ("job.json", 4)])
def test_tf_config_example(yard, cluster4, job_file, tasks):
    folder = example(yard, "tf-config", job_file.replace(".", "-"))
    job = run(yard, folder / job_file, "tf-" + job_file.replace(".", "-"))
    texts = [p.read_text() for p in sorted(stdouterr(yard, job).glob("*-rank*.stdout.txt"))]
    assert len(texts) == tasks, texts
    assert all("TF_CONFIG OK" in t for t in texts), texts
    kinds = sorted(re.search(r"task: (\w+) \d", t).group(1) for t in texts)  # type: ignore[union-attr]
    assert kinds == ["chief", "ps", "worker", "worker"], kinds
    assert_clean_exit(yard, job, tasks)


def test_batchai_refusal_names_the_property(yard, cluster4):
    folder = example(yard, "tf-config", "-refused")
    data = json.loads((folder / "job.json").read_text())
    data["properties"]["secrets"] = [{"name": "TOKEN", "keyVaultSecretReference": {
        "sourceVault": {"id": "/subscriptions/x/resourceGroups/g/providers/"
                              "Microsoft.KeyVault/vaults/v"},
        "secretUrl": "https://v.vault.azure.net/secrets/token"}}]
    (folder / "job.json").write_text(json.dumps(data, indent=2))
    refused = yard.cli("job", "create", "-f", str(folder / "job.json"), "-n", "tf-refused",
                       "-c", CLUSTER)
    assert refused.rc == 2, str(refused)
    said = refused.stdout + refused.stderr
    assert "secrets[0].keyVaultSecretReference" in said and \
        "--ignore secrets[0].keyVaultSecretReference" in said, said
    assert "Traceback" not in said
    assert "tf-refused" not in [j["name"] for j in yard.js("job", "list")]
    job = run(yard, folder / "job.json", "tf-refused", "--ignore", "secrets")
    assert_clean_exit(yard, job, 4)


# --- cluster diagnose --------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["mpi", "gloo"])
def test_cluster_diagnose(yard, cluster4, transport):
    out = yard.ok("cluster", "diagnose", "-n", CLUSTER, "--transport", transport,
                  "--reps", "20", timeout=300)
    text = out.stdout
    assert f"ping-pong over {transport}" in text, str(out)
    assert "Latency" in text and "Bandwidth" in text, str(out)
    assert f"{CLUSTER}-0" in text and f"{CLUSTER}-1" in text, str(out)
    assert "allreduce of" in text and "bus bandwidth" in text, str(out)
    data = yard.js("cluster", "diagnose", "-n", CLUSTER, "--transport", transport,
                   "--reps", "20", timeout=300)
    assert data["transport"] == transport
    assert len(data["pairs"]) == 1
    pair = data["pairs"][0]
    assert {pair["a"], pair["b"]} == {f"{CLUSTER}-0", f"{CLUSTER}-1"}
    assert pair["latency_us"] > 0 and pair["bandwidth_MBps"] > 0


# --- ten clean runs in a row --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_examples_exit_cleanly_ten_times(yard, cluster4):
    """DESIGN §7: no rank dies with gloo's SIGABRT (or anything else) at exit, run after run.
    Short runs (1 DDP epoch, 3 MPI epochs): the exit path is what is tested here."""
    ddp = example(yard, "mnist-ddp", "-x10")
    (ddp / "job-x10.yaml").write_text((ddp / "job.yaml").read_text().replace(
        "--epochs 5", "--epochs 1"))
    mpi = example(yard, "mnist-mpi", "-x10")
    (mpi / "job-x10.yaml").write_text((mpi / "job.yaml").read_text().replace(
        "train_mpi.py -o", "train_mpi.py -e 3 -o"))
    took: dict[str, list[float]] = {"ddp": [], "mpi": []}
    for i in range(10):
        for kind, folder, ranks in (("ddp", ddp, 4), ("mpi", mpi, 8)):
            began = time.monotonic()
            job = run(yard, folder / "job-x10.yaml", f"{kind}-x10-{i}")
            took[kind].append(time.monotonic() - began)
            assert_clean_exit(yard, job, ranks)
    print(f"10 runs: ddp {sum(took['ddp']):.0f}s, mpi {sum(took['mpi']):.0f}s")
