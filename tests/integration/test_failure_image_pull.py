"""The image-pull failure class on a real container runtime (Podman on its own store,
tests/containerkit.py; skipped cleanly where there is none): an image that is not there under
``pull_policy: never``, and one on a registry nothing listens at (127.0.0.1:1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from containerkit import PodmanEngine, podman_engine
from yardkit import Yard

__all__ = ["podman_engine"]

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory,
         podman_engine: PodmanEngine) -> Iterator[Yard]:
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env.update(podman_engine.env)
    y.env["BATCHYARD_CONTAINER_RUNTIME"] = podman_engine.name
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", "box", "-s", "Standard_D2_v2", "-t", "1")
        y.wait_cluster("box", 1)
        yield y
    finally:
        y.stop()


@pytest.mark.parametrize(("key", "environment", "said"), [
    ("never", {"image": "localhost/batchyard/not-here:1", "pull_policy": "never"},
     "not-here"),
    ("noregistry", {"image": "127.0.0.1:1/batchyard/none:1"}, "127.0.0.1:1"),
])
def test_image_pull_failed(yard: Yard, key: str, environment: dict[str, str],
                           said: str) -> None:
    name = f"pull-{key}"
    path = yard.write_job(name, {"environment": environment, "command": "true"})
    yard.ok("job", "create", "-f", str(path), "-c", "box", "-n", name)
    job = yard.wait_job(name, timeout=240)
    assert job["state"] == "failed", job
    error = job["error"]
    assert error["cause"] == "image pull failed" and error["node"] == "box-0", error
    assert said in job["message"] and "(image pull failed)" in job["message"], job["message"]
    assert job["attempts"][-1]["error"]["cause"] == "image pull failed"
    shown = yard.ok("job", "show", "-n", name).stdout
    assert "image pull failed" in shown and said in shown, shown
