"""The container harness (tests/containerkit.py) does what the container tests rely on.

Checked, with Docker (our own dockerd) and Podman (our own store): the base image runs python3
with ``--network host --init``; the mpich image's mpirun is MPICH's hydra and its mpi4py says
MPICH (two ranks allreduce in one container); the openmpi image's says Open MPI; a derived
image pushed to the private registry pulls back with the product's recipe (docker-style
config.json: ``DOCKER_CONFIG=dir docker pull``, ``podman pull --authfile``) and a wrong
password fails with the registry's "unauthorized: authentication required"; a ``--network
host`` container started inside a network namespace (a hostkit host) gets that namespace's
interfaces (podman: started there with nsenter; docker: a dockerd started there); no
container is left behind. Root only: skipped elsewhere. Cold (images not cached on this
machine) a few minutes, warm ~45 s; the torch image is checked with Docker only.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from containerkit import (
    DockerEngine,
    Engine,
    ImageKit,
    KindImage,
    PodmanEngine,
    Registry,
    docker_engine,
    podman_engine,
    registry,
    test_images,
    torch_image,
)
from hostkit import HostNet, hostnet

__all__ = ["docker_engine", "hostnet", "podman_engine", "registry", "test_images", "torch_image"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ENGINES = ["docker_engine", "podman_engine"]
UNAUTHORIZED = "unauthorized: authentication required"
MPI4PY_ALLREDUCE = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
                    "print('rank', c.rank, c.size, c.allreduce(c.rank + 1), flush=True)")


@pytest.fixture(params=ENGINES, ids=["docker", "podman"])
def engine(request: pytest.FixtureRequest) -> Engine:
    e: Engine = request.getfixturevalue(request.param)
    return e


def _run(engine: Engine, image: str, *argv: str, timeout: float = 120) -> str:
    res = engine.run(["run", "--rm", "--network", "host", "--init", image, *argv],
                     timeout=timeout)
    return res.stdout


def test_engines_started(docker_engine: DockerEngine, podman_engine: PodmanEngine) -> None:
    print(f"\ndockerd: {docker_engine.driver}, {docker_engine.start_seconds:.2f}s, "
          f"persistent={docker_engine.persistent}, cli={docker_engine.cli}")
    print(f"podman: {podman_engine.driver}, {podman_engine.start_seconds:.2f}s, "
          f"persistent={podman_engine.persistent}, env={podman_engine.env}")
    assert docker_engine.name == "docker" and podman_engine.name == "podman"
    assert docker_engine.env["DOCKER_HOST"] == f"unix://{docker_engine.sock}"
    assert set(podman_engine.env) >= {"CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF"}
    info = podman_engine.run(["info", "--format", "{{.Host.OCIRuntime.Name}} "
                              "{{.Host.CgroupManager}} {{.Store.GraphRoot}}"]).stdout.split()
    assert info == ["runc", "cgroupfs", str(podman_engine.graphroot)]


def test_docker_on_path_talks_to_our_daemon(docker_engine: DockerEngine) -> None:
    """Whatever ``docker`` is first on PATH (here /usr/local/bin's client-only 28.x) works
    with Debian's 20.10 daemon through DOCKER_HOST alone (API version negotiation)."""
    res = subprocess.run(["docker", "version", "--format",
                          "{{.Client.Version}} {{.Server.Version}} {{.Server.APIVersion}}"],
                         env=docker_engine.full_env(), capture_output=True, text=True, timeout=30)
    print(f"\ndocker on PATH: {res.stdout.strip()}")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[2] == docker_engine.run(
        ["version", "--format", "{{.Server.APIVersion}}"]).stdout.strip()


def test_base_image_runs_python_with_host_network(engine: Engine, test_images: ImageKit
                                                  ) -> None:
    image = test_images.name("base", engine)
    assert image == engine.qualify(f"local/batchyard-base:{test_images.tag('base')}")
    assert image.startswith("localhost/local/" if engine.name == "podman" else "local/")
    t0 = time.monotonic()
    out = _run(engine, image, "python3", "-c",
               "import os, socket, numpy; print(socket.gethostname(), os.getpid(), "
               "numpy.__version__, ','.join(sorted(os.listdir('/sys/class/net'))))")
    print(f"\n{engine.name} run: {time.monotonic() - t0:.2f}s {out.strip()}; "
          f"kit timings {test_images.timings}")
    host, pid, _numpy, ifaces = out.split()
    assert host == subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert int(pid) > 1  # --init: catatonit (podman) / tini (docker) is pid 1
    assert ifaces.split(",") == sorted(os.listdir("/sys/class/net"))  # host network
    # the tools jobs need
    out = _run(engine, image, "bash", "-c", "sleep 0.1 & kill $!; ps -o comm= 1; echo ok")
    assert out.split()[-1] == "ok"


def test_mpich_image_runs_mpich(engine: Engine, test_images: ImageKit) -> None:
    image = test_images.name("mpich", engine)
    out = _run(engine, image, "sh", "-c", "command -v mpirun; command -v mpiexec; mpirun --version")
    assert out.splitlines()[:2] == ["/usr/local/bin/mpirun", "/usr/local/bin/mpiexec"]
    assert "HYDRA build details" in out and "Version:" in out
    out = _run(engine, image, "python3", "-c",
               "from mpi4py import MPI; print(MPI.Get_library_version())")
    assert out.startswith("MPICH Version:"), out
    out = _run(engine, image, "mpirun", "-n", "2", "python3", "-c", MPI4PY_ALLREDUCE)
    assert sorted(line for line in out.splitlines() if line.startswith("rank")) == [
        "rank 0 2 3", "rank 1 2 3"], out
    out = _run(engine, image, "python3", "-c",
               "import sklearn, pathlib; print(next(pathlib.Path(sklearn.__path__[0])"
               ".glob('datasets/data/digits.csv.gz')))")
    assert out.strip().endswith("digits.csv.gz")


def test_openmpi_image_runs_open_mpi(engine: Engine, test_images: ImageKit) -> None:
    image = test_images.name("openmpi", engine)
    out = _run(engine, image, "sh", "-c", "mpirun --version; python3 -c "
               "'from mpi4py import MPI; print(MPI.Get_library_version())'")
    assert "mpirun (Open MPI) 4.1" in out and "Open MPI v4.1" in out, out
    out = _run(engine, image, "mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2",
               "python3", "-c", MPI4PY_ALLREDUCE)
    assert sorted(line for line in out.splitlines() if line.startswith("rank")) == [
        "rank 0 2 3", "rank 1 2 3"], out


@pytest.mark.torch
def test_torch_image_runs_torch_cpu(docker_engine: DockerEngine, torch_image: KindImage) -> None:
    """The ~1 GB image (built only when a test asks for it): torch CPU with gloo, sklearn."""
    image = torch_image.name(docker_engine)
    assert image == f"local/batchyard-torch:{torch_image.kit.tag('torch')}"
    out = _run(docker_engine, image, "python3", "-c",
               "import torch, torch.distributed as dist, sklearn; print(torch.__version__, "
               "dist.is_gloo_available(), torch.ones(3).sum().item())")
    assert out.split() == ["2.13.0+cpu", "True", "3.0"], out


def test_registry_pull_with_credentials(engine: Engine, test_images: ImageKit,
                                        registry: Registry, tmp_path: Path) -> None:
    name = f"local/containerkit-derived-{engine.name}:1"
    image = test_images.build_derived(engine, name, base="tiny")
    assert _run(engine, image).startswith("hello from a derived image on ")
    t0 = time.monotonic()
    remote = registry.push(engine, image)
    print(f"\n{engine.name} push {remote}: {time.monotonic() - t0:.2f}s")
    assert remote == f"{registry.address}/batchyard/containerkit-derived-{engine.name}:1"
    assert not engine.has_image(remote)

    def pull(auth_dir: Path) -> subprocess.CompletedProcess[str]:
        if engine.name == "docker":
            return engine.run(["pull", remote], check=False, env={"DOCKER_CONFIG": str(auth_dir)})
        return engine.run(["pull", "--authfile", auth_dir / "config.json", remote], check=False)

    bad = pull(tmp_path.parent / f"{tmp_path.name}-none")  # no credentials at all
    assert bad.returncode != 0 and ("no basic auth credentials" in bad.stderr
                                    or "no such file" in bad.stderr), bad.stderr
    wrong = registry.write_auth(tmp_path / "wrong", password="not-the-password")
    assert oct(wrong.stat().st_mode & 0o777) == "0o600"
    bad = pull(wrong.parent)
    print(f"wrong password ({engine.name}): {bad.stderr.strip()}")
    assert bad.returncode != 0 and UNAUTHORIZED in bad.stderr, bad.stderr
    assert not engine.has_image(remote)
    good = pull(registry.write_auth(tmp_path / "good").parent)
    assert good.returncode == 0, good.stderr
    assert _run(engine, remote).startswith("hello from a derived image on ")
    engine.run(["rmi", remote, image])


def test_podman_in_a_network_namespace_gets_its_interfaces(
        podman_engine: PodmanEngine, test_images: ImageKit, hostnet: HostNet) -> None:
    """podman started with nsenter --net (hostkit's Host) puts a ``--network host`` container
    into that namespace, with that host's hostname; ``ip netns exec`` would hide the cgroup fs
    (runc: "no cgroup mount found in mountinfo")."""
    image = test_images.name("base", podman_engine)
    host = hostnet.add_host("pm1")
    res = host.run([*podman_engine.cli, "run", "--rm", "--network", "host", "--init", image,
                    "sh", "-c", "hostname; ip -4 -o addr show"], env=podman_engine.full_env(),
                   timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "pm1"
    assert f"inet {host.addr}/24" in res.stdout and "eth0" in res.stdout, res.stdout
    assert podman_engine.container_ids() == []


def test_docker_daemon_in_a_network_namespace(test_images: ImageKit, hostnet: HostNet) -> None:
    """One dockerd is one network namespace: ``--network host`` means the daemon's. A dockerd
    started inside a hostkit host serves that host (its own store; images imported into it)."""
    host = hostnet.add_host("dk1")
    t0 = time.monotonic()
    engine = DockerEngine(host=host)
    try:
        engine.start()
        started = time.monotonic() - t0
        image = test_images.name("tiny", engine)
        out = _run(engine, image, "sh", "-c", "hostname; ip -4 -o addr show")
        print(f"\ndockerd in {host}: started {started:.2f}s, {engine.driver}")
        assert out.splitlines()[0] == "dk1"
        assert f"inet {host.addr}/24" in out, out
        assert engine.container_ids() == []
    finally:
        engine.close()
    assert engine.proc is None


def test_no_container_left(docker_engine: DockerEngine, podman_engine: PodmanEngine) -> None:
    assert docker_engine.container_ids() == []
    assert podman_engine.container_ids() == []
    assert not [ref for _, ref in docker_engine.images() if "containerkit-derived" in ref]
    assert not [ref for _, ref in podman_engine.images() if "containerkit-derived" in ref]
