"""Jobs in container images on a real Docker engine (tests/containerkit.py), through the CLI
and a real server: seed 000's job.json with its ``containerSettings`` kept (2 nodes x 4
processes, chainerSettings over MPICH in the image, through the relay), the env contract the
same inside as outside, a private registry with credentials (and a wrong password), and the
stop rules (terminate, wall clock, fail-fast, a killed launcher) leaving no container and no
process behind."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from containerkit import (
    Engine,
    ImageKit,
    KindImage,
    Registry,
    docker_engine,
    podman_engine,
    registry,
    test_images,
    torch_image,
)
from yardkit import Yard, pids_where, tagged_pids

__all__ = ["docker_engine", "podman_engine", "registry", "test_images", "torch_image"]

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLUSTER = "box4"
VARY = ("BATCHYARD_JOB_ID", "MASTER_PORT", "AZ_BATCH_MASTER_NODE",
        "AZ_BATCHAI_PYTORCH_INIT_METHOD")
ENV_DUMP = ("python3 -c 'import json, os; json.dump(dict(os.environ), "
            "open(os.environ[\"BATCHYARD_OUTPUT_ENV\"] + \"/rank\" + os.environ[\"RANK\"] "
            "+ \".json\", \"w\"))'")


@pytest.fixture(scope="module", params=["docker", "podman"])
def engine(request: pytest.FixtureRequest) -> Engine:
    """Each test runs on both runtimes (the node finds whichever it has)."""
    found: Engine = request.getfixturevalue(f"{request.param}_engine")
    return found


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory, engine: Engine) -> Iterator[Yard]:
    """A server whose node launchers find our engine (DOCKER_HOST, or Podman's
    CONTAINERS_* configs; BATCHYARD_CONTAINER_RUNTIME so a node with both picks this one)."""
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env.update(engine.env)
    y.env["BATCHYARD_CONTAINER_RUNTIME"] = engine.name
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", CLUSTER, "--cpus", "4", "-t", "2")
        y.wait_cluster(CLUSTER, 2)
        yield y
    finally:
        y.stop()


def ours(engine: Engine) -> list[str]:
    """batchyard's containers on the engine, running or not (the runtime's own ``ps -a``)."""
    out = engine.run(["ps", "-a", "--filter", "label=batchyard.attempt",
                      "--format", "{{.Names}}"]).stdout
    return [line for line in out.split() if line]


def wait_no_containers(engine: Engine, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while ours(engine) and time.time() < deadline:
        time.sleep(0.3)
    assert ours(engine) == []


def submit(yard: Yard, path: Path, name: str, *extra: str) -> None:
    yard.ok("job", "create", "-f", str(path), "-n", name, "-c", CLUSTER, *extra)


def logs(yard: Yard, job: dict[str, Any]) -> str:
    folder = yard.attempt_dir(job) / "stdouterr"
    return "".join(f"--- {p.name}\n{p.read_text()[-2000:]}\n" for p in sorted(folder.glob("*")))


def finished(yard: Yard, name: str, state: str, timeout: float = 400) -> dict[str, Any]:
    job = yard.wait_job(name, timeout=timeout)
    assert job["state"] == state, f"{job['state']}: {job.get('message')}\n{logs(yard, job)}"
    return job


def seed_job(yard: Yard, image: str, tag: str) -> Path:
    """examples/mnist-mpi (seed 000's job.json, chainerSettings processCount 8) with only
    the image added to it: containerSettings as Batch AI had it."""
    folder = yard.work / f"seed-{tag}"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(EXAMPLES / "mnist-mpi", folder,
                    ignore=shutil.ignore_patterns("logs", "result", "__pycache__"))
    (folder / "logs").mkdir()
    (folder / "result").mkdir()
    job = json.loads((folder / "job.json").read_text())
    job["properties"]["containerSettings"] = {"imageSourceRegistry": {"image": image}}
    (folder / "job.json").write_text(json.dumps(job, indent=2))
    return folder / "job.json"


def test_seed000_job_json_runs_in_its_image(yard: Yard, engine: Engine,
                                            test_images: ImageKit) -> None:
    image = test_images.name("mpich", engine)
    submit(yard, seed_job(yard, image, "mpich"), "seed-mpich")
    job = finished(yard, "seed-mpich", "succeeded")
    text = logs(yard, job)
    folder = yard.attempt_dir(job) / "stdouterr"
    for rank in range(8):
        assert (folder / f"{CLUSTER}-{rank // 4}-rank{rank}.stdout.txt").is_file(), text
    assert "MPI world size 8" in (folder / f"{CLUSTER}-0-rank0.stdout.txt").read_text()
    for node in (0, 1):  # the preparation ran in the image, on both nodes
        prep = (folder / f"{CLUSTER}-{node}-prepare.stdout.txt").read_text()
        assert "MPICH Version" in prep and "jobprep done" in prep, prep
        launcher = (folder / f"{CLUSTER}-{node}-launcher.txt").read_text()
        assert "--network host" in launcher and image in launcher
    assert "MPI in the image: mpich" in (folder / f"{CLUSTER}-0-launcher.txt").read_text()
    wait_no_containers(engine)
    nodes = yard.js("cluster", "node", "list", CLUSTER)
    for node in nodes:
        found = node["resources"]["containers"]
        assert found["runtime"] == engine.name and found["images"] >= 1, node


def test_mnist_mpi_under_open_mpi_in_its_image(yard: Yard, engine: Engine,
                                               test_images: ImageKit) -> None:
    """The native twin of the job (mpi distribution, 2 x 4) in an image whose MPI is
    Debian's Open MPI: found by its ``mpirun --version``, started through the relay."""
    image = test_images.name("openmpi", engine)
    folder = yard.work / "mpi-openmpi"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(EXAMPLES / "mnist-mpi", folder,
                    ignore=shutil.ignore_patterns("logs", "result", "__pycache__"))
    yard.ok("job", "create", "-f", str(folder / "job.yaml"), "-n", "mpi-openmpi", "-c",
            CLUSTER, "--set", f"environment.image={image}")
    job = finished(yard, "mpi-openmpi", "succeeded")
    out = yard.attempt_dir(job) / "stdouterr"
    assert "MPI in the image: openmpi" in (out / f"{CLUSTER}-0-launcher.txt").read_text()
    assert "MPI world size 8" in (out / f"{CLUSTER}-0-rank0.stdout.txt").read_text()
    assert "Open MPI" in (out / f"{CLUSTER}-1-prepare.stdout.txt").read_text()
    for rank in range(8):
        assert (out / f"{CLUSTER}-{rank // 4}-rank{rank}.stdout.txt").is_file()
    assert (yard.attempt_dir(job) / "outputs" / "MODEL" / "model.npz").is_file()
    wait_no_containers(engine)


def test_rank_env_inside_matches_outside(yard: Yard, engine: Engine,
                                         test_images: ImageKit) -> None:
    """Every variable of the env contract has the same value in the container as on the
    bare node (paths included: the job's directories are mounted at the same paths)."""
    image = test_images.name("base", engine)
    dumps = {}
    for tag, environment in (("bare", {}), ("boxed", {"image": image})):
        path = yard.write_job(f"env-{tag}", {
            "nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
            "environment": environment, "outputs": {"ENV": {}}, "env": {"MINE": "x y"},
            "secrets": {"TOKEN_A": "s3cret"}, "command": ENV_DUMP})
        submit(yard, path, f"env-{tag}")
        job = finished(yard, f"env-{tag}", "succeeded")
        dumps[tag] = {int(p.stem[4:]): json.loads(p.read_text()) for p in
                      yard.attempt_dir(job).glob("outputs/ENV/rank*.json")}
        assert sorted(dumps[tag]) == [0, 1, 2, 3], dumps[tag]
    uuids = [yard.job(f"env-{tag}")["attempts"][-1]["uuid"] for tag in ("bare", "boxed")]

    def same_job(value: str) -> str:
        """A value of the bare job as it reads for the boxed one (name and attempt)."""
        return value.replace(uuids[0], uuids[1]).replace(uuids[0][:8], uuids[1][:8]) \
            .replace("env-bare", "env-boxed")

    contract = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
                "LOCAL_WORLD_SIZE", "BATCHYARD_NUM_NODES", "AZ_BATCHAI_TASK_INDEX",
                "BATCHYARD_NODE_IPS", "MINE", "TOKEN_A", "OMP_NUM_THREADS", "PYTHONUNBUFFERED")
    for rank in range(4):
        bare, boxed = dumps["bare"][rank], dumps["boxed"][rank]
        keys = {k for k in bare if k.startswith(("BATCHYARD_", "AZ_BATCHAI_", "AZUREML_"))
                or k in contract} - {"BATCHYARD_PROC_TAG", "BATCHYARD_TOKEN", "BATCHYARD_API",
                                     # the host's python shims: the image has its own python
                                     "BATCHYARD_JOB_BIN"}
        for key in sorted(keys):
            assert key in boxed, key
            if key in VARY:
                continue  # ids and ports: two jobs cannot share them
            assert boxed[key] == same_job(bare[key]), (key, bare[key], boxed[key])
        # inside, the image decides what the host's environment does not
        assert boxed["HOME"] == "/root" and "/.venv/" not in boxed["PATH"]
        assert "/.venv/" in bare["PATH"] or "python" in bare["PATH"]
    wait_no_containers(engine)


def test_private_registry_credentials(yard: Yard, engine: Engine,
                                      test_images: ImageKit, registry: Registry) -> None:
    remote = registry.push(engine, test_images.name("tiny", engine),
                           repo="private/tiny", tag="v1")
    assert not engine.has_image(remote)

    def job_json(name: str, password: str) -> Path:
        folder = yard.work / name
        folder.mkdir(exist_ok=True)
        path = folder / "job.json"
        path.write_text(json.dumps({"properties": {
            "nodeCount": 1,
            "customToolkitSettings": {"commandLine": "echo pulled-and-ran; cat /etc/os-release"
                                      " 2>/dev/null | head -1; true"},
            "containerSettings": {"imageSourceRegistry": {
                "serverUrl": registry.address, "image": remote.split("/", 1)[1],
                "credentials": {"username": registry.username, "password": password}}}}}))
        return path

    wrong = "not-" + registry.password
    submit(yard, job_json("reg-wrong", wrong), "reg-wrong")
    job = finished(yard, "reg-wrong", "failed")
    assert remote in job["message"] and "pull" in job["message"], job["message"]
    assert "unauthorized" in job["message"].lower() or "denied" in job["message"].lower() \
        or "authentication" in job["message"].lower(), job["message"]

    dry = yard.ok("job", "create", "-f", str(job_json("reg-dry", registry.password)), "-n",
                  "reg-dry", "-c", CLUSTER, "--dry-run").stdout
    assert f"{engine.name} run" in dry and remote in dry and "--network host" in dry, dry

    submit(yard, job_json("reg-ok", registry.password), "reg-ok")
    job = finished(yard, "reg-ok", "succeeded")
    assert "pulled-and-ran" in logs(yard, job)
    assert f"image {remote}: pulled" in logs(yard, job)
    assert engine.has_image(remote)
    submit(yard, job_json("reg-again", registry.password), "reg-again")  # once per node
    again = finished(yard, "reg-again", "succeeded")
    assert f"image {remote}: cached" in logs(yard, again)

    # the password is nowhere: API, CLI, dry run, logs, the database, node-side files
    for secret in (registry.password, wrong):
        for shown in (dry, json.dumps(yard.http.get("/workspaces/default/experiments/default/"
                                                    "jobs/reg-ok").json()),
                      yard.ok("job", "show", "reg-ok", "--output", "json").stdout,
                      yard.ok("job", "list", "--output", "json").stdout,
                      logs(yard, job)):
            assert secret not in shown
        for path in yard.home.rglob("*"):
            if path.is_file() and path.stat().st_size < 50_000_000:
                assert secret.encode() not in path.read_bytes(), path
    db = next(yard.home.rglob("*.db"), None)
    if db is not None:
        with sqlite3.connect(db) as conn:
            dump = "\n".join(conn.iterdump())
        assert registry.password not in dump
    wait_no_containers(engine)


def test_batchai_job_temp_paths_in_a_container(yard: Yard, engine: Engine,
                                               test_images: ImageKit) -> None:
    """A Batch AI job.json with containerSettings and stdOutErrPathPrefix
    $AZ_BATCHAI_JOB_TEMP (and an output under it): the variables expand on the node, as
    Batch AI expanded them, so the container's mounts are real paths."""
    folder = yard.work / "bai-temp"
    folder.mkdir(exist_ok=True)
    path = folder / "job.json"
    path.write_text(json.dumps({"properties": {
        "nodeCount": 1,
        "customToolkitSettings": {"commandLine": "echo logs in $AZ_BATCHAI_STDOUTERR_DIR; "
                                  "echo made > $AZ_BATCHAI_OUTPUT_MODEL/made.txt"},
        "stdOutErrPathPrefix": "$AZ_BATCHAI_JOB_TEMP",
        "outputDirectories": [{"id": "MODEL", "pathPrefix": "$AZ_BATCHAI_JOB_TEMP/out"}],
        "containerSettings": {"imageSourceRegistry": {
            "image": test_images.name("base", engine)}}}}))
    submit(yard, path, "bai-temp")
    job = finished(yard, "bai-temp", "succeeded")
    text = logs(yard, job)
    said = next(line for line in text.splitlines() if line.startswith("logs in "))
    assert said.startswith("logs in /") and said.endswith("/stdouterr"), said
    assert "$AZ_BATCHAI" not in said and "/tmp/default/default/bai-temp/" in said, said
    assert (yard.attempt_dir(job) / "outputs" / "MODEL" / "made.txt").read_text() == "made\n"
    wait_no_containers(engine)


def test_a_container_that_does_not_start_is_not_an_image_pull_failure(
        yard: Yard, engine: Engine, tmp_path: Path) -> None:
    """The image is there (nothing to pull) but its container cannot start: it has no
    ``sleep`` for the node's container to wait with."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "README").write_text("an image with nothing to run\n")
    tar = tmp_path / "nosleep.tar"
    import tarfile

    with tarfile.open(tar, "w") as out:
        out.add(root / "README", arcname="README")
    name = "local/batchyard-nosleep:1"
    engine.import_image(tar, name, [])
    path = yard.write_job("nosleep", {"environment": {"image": engine.qualify(name)},
                                      "command": "echo never"})
    submit(yard, path, "nosleep")
    job = finished(yard, "nosleep", "failed")
    assert job["error"]["cause"] == "preparation failed", job["error"]
    assert "starting the container failed" in job["message"], job["message"]
    assert "image pull failed" not in job["message"], job["message"]
    wait_no_containers(engine)


@pytest.mark.parametrize("how", ["terminate", "wall_clock", "fail_fast", "launcher_killed"])
def test_stops_leave_no_container_and_no_process(yard: Yard, engine: Engine,
                                                 test_images: ImageKit, how: str) -> None:
    image = test_images.name("base", engine)
    command = "sleep 300"
    limits: dict[str, Any] = {"grace_period": 2}
    if how == "wall_clock":
        limits["max_wall_clock"] = 6
    if how == "fail_fast":
        command = '[ "$RANK" = 3 ] && { sleep 2; exit 7; }; sleep 300'
    name = f"stop-{how.replace('_', '-')}"
    path = yard.write_job(name, {"nodes": 2, "distribution": {"processes_per_node": 2},
                                 "environment": {"image": image}, "limits": limits,
                                 "command": command})
    submit(yard, path, name)
    yard.wait_job(name, states=("running",), timeout=120)
    deadline = time.time() + 60
    while len(ours(engine)) < 2 and time.time() < deadline:
        time.sleep(0.2)
    assert len(ours(engine)) == 2
    job = yard.job(name)
    uuid = job["attempts"][-1]["uuid"]
    while len(tagged_pids(uuid)) < 4 and time.time() < deadline:  # ranks, seen from the host
        time.sleep(0.2)
    if how == "terminate":
        yard.ok("job", "terminate", name)
    elif how == "launcher_killed":
        import os
        import signal

        reports = yard.node_reports(yard.job(name))
        victim = next(r for r in reports if r["node_rank"] == 1)
        os.kill(int(victim["pid"]), signal.SIGKILL)
    state = {"terminate": "canceled", "wall_clock": "failed", "fail_fast": "failed",
             "launcher_killed": "failed"}[how]
    job = finished(yard, name, state, timeout=120)
    if how == "fail_fast":
        assert "rank 3" in job["message"] and "7" in job["message"], job["message"]
    if how == "wall_clock":
        assert "wall clock" in job["message"], job["message"]
    wait_no_containers(engine)
    deadline = time.time() + 20
    while tagged_pids(uuid) and time.time() < deadline:
        time.sleep(0.2)
    assert tagged_pids(uuid) == []
    yard.assert_no_process_left(job)
    assert pids_where(lambda blob: b"sleep\x00300" in blob and uuid.encode() in blob) == []


def test_mnist_ddp_same_result_with_and_without_container(
        yard: Yard, engine: Engine, torch_image: KindImage) -> None:
    """examples/mnist-ddp, 2 nodes x 2 ranks, bare and in an image with the same PyTorch:
    the same test accuracy and the same trained parameters on every rank."""
    if engine.name != "docker":
        pytest.skip("one runtime is enough for the 1 GB image")
    image = torch_image.name(engine)
    results = {}
    for tag, extra in (("bare", []), ("boxed", ["--set", f"environment.image={image}"])):
        folder = yard.work / f"ddp-{tag}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(EXAMPLES / "mnist-ddp", folder,
                        ignore=shutil.ignore_patterns("outputs", "__pycache__"))
        spec = (folder / "job.yaml").read_text().replace(
            "--epochs 5", "--epochs 2 --write-param-hashes")
        (folder / "job.yaml").write_text(spec)
        yard.ok("job", "create", "-f", str(folder / "job.yaml"), "-n", f"ddp-{tag}", "-c",
                CLUSTER, *extra, timeout=300)
        job = finished(yard, f"ddp-{tag}", "succeeded", timeout=600)
        model = yard.attempt_dir(job) / "outputs" / "MODEL"
        hashes = {p.name: p.read_text().strip() for p in model.glob("params-rank*.sha256")}
        assert len(hashes) == 4 and len(set(hashes.values())) == 1, hashes
        text = logs(yard, job)
        accuracy = re.findall(r"test accuracy: ([0-9.]+)", text)
        assert len(accuracy) == 1, text
        results[tag] = (accuracy[0], set(hashes.values()))
    assert "docker run -d" in logs(yard, yard.job("ddp-boxed"))
    assert results["bare"] == results["boxed"], results
