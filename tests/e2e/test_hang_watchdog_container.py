"""The hang watchdog on a gang in Docker containers (the job's image): the ranks are the
host's processes too, and py-spy run by each node's launcher on the host reads them across
the container's namespaces (nothing is run inside the container). Same deadlock as
test_hang_watchdog.py: rank 3 on a lock, ranks 0-2 in a barrier; ``on_hang: fail``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_hang_watchdog import HANG, HANG_TIMEOUT

from containerkit import DockerEngine, ImageKit, docker_engine, test_images
from yardkit import Yard

__all__ = ["docker_engine", "test_images"]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory,
         docker_engine: DockerEngine) -> Iterator[Yard]:
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env.update(docker_engine.env)
    y.env["BATCHYARD_CONTAINER_RUNTIME"] = docker_engine.name
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", "box", "--cpus", "2", "-t", "2")
        y.wait_cluster("box", 2)
        yield y
    finally:
        y.stop()


def test_hung_gang_in_containers_is_dumped_from_the_host(
        yard: Yard, docker_engine: DockerEngine, test_images: ImageKit) -> None:
    name = "boxhang"
    path = yard.write_job(name, {
        "nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
        "command": "python3 hang.py", "code": str(yard.work / "jobs" / name),
        "environment": {"image": test_images.name("base", docker_engine)},
        "limits": {"hang_timeout": HANG_TIMEOUT, "on_hang": "fail", "grace_period": 1,
                   "max_wall_clock": 300}}, files={"hang.py": HANG})
    yard.ok("job", "create", "-f", str(path), "-n", name, "-c", "box")
    job = yard.wait_job(name, timeout=300)
    assert job["state"] == "failed" and job["message"].startswith("hung:"), job
    assert "rank 3 in take_twice (hang.py:" in job["message"], job
    assert "ranks 0-2 in barrier (hang.py:" in job["message"], job
    kept = yard.js("job", "stacks", name, "--id",
                   yard.js("job", "stacks", name, "--list")[0]["id"])
    assert all("container" in d["note"] for d in kept["dumps"]), kept["dumps"]
    yard.assert_no_process_left(job)
