"""`batchyard job exec -it` into a job's container (a real dockerd, tests/containerkit.py):
the shell runs in the node's container with the job's env and work dir, and a failed gang's
container stays for `limits.keep_alive_on_failure`, then is removed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from containerkit import DockerEngine, ImageKit, docker_engine, test_images
from ptykit import Pty
from yardkit import Yard, wait_until

__all__ = ["docker_engine", "test_images"]

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory, docker_engine: DockerEngine
         ) -> Iterator[Yard]:
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env.update(docker_engine.env)
    y.env["BATCHYARD_CONTAINER_RUNTIME"] = docker_engine.name
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", "boxed", "--cpus", "2", "-t", "2")
        y.wait_cluster("boxed", 2)
        yield y
    finally:
        y.stop()


def ours(engine: DockerEngine) -> list[str]:
    out = engine.run(["ps", "-a", "--filter", "label=batchyard.attempt",
                      "--format", "{{.Names}}"]).stdout
    return out.split()


def test_exec_it_into_the_container_of_a_failed_gang(yard: Yard, docker_engine: DockerEngine,
                                                     test_images: ImageKit) -> None:
    image = test_images.name("base", docker_engine)
    job = {"name": "boxed", "nodes": 2, "environment": {"image": image},
           "distribution": {"type": "pytorch", "processes_per_node": 1},
           "command": 'echo "rank $RANK" > "$AZ_BATCHAI_JOB_TEMP/trace"; '
                      'if [ "$NODE_RANK" = 1 ]; then exit 9; fi; sleep 600',
           "limits": {"grace_period": 2, "keep_alive_on_failure": "5m"}}
    yard.ok("job", "create", "-f", str(yard.write_job("boxed", job)), "-c", "boxed")
    failed = yard.wait_job("boxed", timeout=300)
    assert failed["state"] == "failed" and failed["exit_code"] == 9, failed
    assert len(ours(docker_engine)) == 2  # both nodes' containers kept for exec
    term = Pty.cli(yard, "job", "exec", "boxed", "--node", "1", "-it")
    term.expect(r"[#$] $")
    term.send('echo "IN=$([ -f /.dockerenv ] && echo box) N=$NODE_RANK '
              'T=$(cat "$AZ_BATCHAI_JOB_TEMP/trace") P=$(pwd)"; exit 4\r')
    found = term.expect(r"IN=box N=1 T=rank 1 P=(/\S+)")
    assert found.group(1).decode().endswith("/wd")
    assert term.wait() == 4
    yard.ok("job", "terminate", "boxed")  # ends the keep-alive: the containers go
    wait_until(lambda: ours(docker_engine) == [], 60, what="the kept containers to be removed")
    yard.assert_no_process_left(yard.job("boxed"), timeout=20)
