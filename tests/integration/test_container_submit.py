"""A container job where no node can run containers is refused at submit, naming the image
and the cluster; nothing is queued. The nodes say why (``cluster node list``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from yardkit import Yard


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env["BATCHYARD_CONTAINER_RUNTIME"] = "none"  # as on a node without Docker or Podman
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", "plain", "-s", "Standard_D2_v2", "-t", "1")
        y.wait_cluster("plain", 1)
        yield y
    finally:
        y.stop()


def test_container_job_refused_when_no_node_has_a_runtime(yard: Yard) -> None:
    nodes = yard.js("cluster", "node", "list", "plain")
    assert [n["resources"]["containers"] for n in nodes] == [None]
    table = yard.ok("cluster", "node", "list", "plain").stdout
    assert "Containers" in table and "none" in table
    path = yard.write_job("boxed", {"environment": {"image": "local/some:1"},
                                    "command": "true"})
    result = yard.cli("job", "create", "-f", str(path), "-c", "plain")
    assert result.rc != 0, str(result)
    assert "environment.image" in result.stderr and "local/some:1" in result.stderr
    assert "no node of cluster 'plain' has a container runtime" in result.stderr
    assert "Traceback" not in result.stderr
    assert yard.js("job", "list") == []
    plain = yard.write_job("plain", {"command": "true"})  # the same cluster runs the rest
    yard.ok("job", "create", "-f", str(plain), "-c", "plain", "-n", "plain")
    assert yard.wait_job("plain")["state"] == "succeeded"
