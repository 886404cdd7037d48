"""Docker Hub short names (``image: busybox``) on a Podman node, with real Podman and a real
registry (tests/containerkit.py). Docker reads a short name as Docker Hub's
(``docker.io/library/NAME``); Podman refuses one its registries configuration does not
resolve ("did not resolve to an alias and no unqualified-search registries are defined").
batchyard qualifies it as Docker does, unless the node's registries.conf says otherwise (search
registries, an alias). No registry on the internet is reachable here, so an anonymous local
registry stands in for Docker Hub: the node's registries.conf maps docker.io to it (a
mirror's ``prefix``/``location``), which is not about short names at all."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from containerkit import ImageKit, PodmanEngine, Registry, podman_engine, test_images
from yardkit import Yard

__all__ = ["podman_engine", "test_images"]

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


@pytest.fixture(scope="module")
def hub(podman_engine: PodmanEngine) -> Iterator[Registry]:
    """An anonymous registry: the stand-in for Docker Hub."""
    reg = Registry(anonymous=True).start()
    try:
        yield reg
    finally:
        reg.close()


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory, podman_engine: PodmanEngine
         ) -> Iterator[Yard]:
    """A server whose nodes run Podman with a registries.conf of this module's own."""
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env.update(podman_engine.env)
    y.env["CONTAINERS_REGISTRIES_CONF"] = str(y.work / "registries.conf")
    (y.work / "registries.conf").write_text("unqualified-search-registries = []\n")
    y.env["BATCHYARD_CONTAINER_RUNTIME"] = "podman"
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", "pod", "-s", "Standard_D2_v2", "-t", "1")
        y.wait_cluster("pod", 1)
        yield y
    finally:
        y.stop()


def _conf(yard: Yard, hub: Registry, *lines: str) -> None:
    """The node's registries.conf (Podman reads it at every call)."""
    text = [*lines, "", "[[registry]]", f'location = "{hub.address}"', "insecure = true", ""]
    Path(yard.env["CONTAINERS_REGISTRIES_CONF"]).write_text("\n".join(text))


def _run(yard: Yard, name: str, image: str) -> tuple[dict[str, object], str]:
    path = yard.write_job(name, {"environment": {"image": image},
                                 "command": "echo ran in $(cat /etc/group | head -1)"})
    yard.ok("job", "create", "-f", str(path), "-n", name, "-c", "pod")
    job = yard.wait_job(name, timeout=300)
    folder = yard.attempt_dir(job) / "stdouterr"  # the server's copies, the launcher's too
    logs = "".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(folder.glob("*.txt")))
    return job, logs


def _pushed(hub: Registry, podman: PodmanEngine, images: ImageKit, repo: str) -> str:
    remote = hub.push(podman, images.name("tiny", podman), repo=repo, tag="1")
    assert not podman.has_image(remote)
    return remote


def test_a_short_name_is_docker_hubs(yard: Yard, hub: Registry, podman_engine: PodmanEngine,
                                     test_images: ImageKit) -> None:
    name = f"byshort-{secrets.token_hex(4)}"
    _pushed(hub, podman_engine, test_images, f"library/{name}")
    _conf(yard, hub, "unqualified-search-registries = []", 'short-name-mode = "enforcing"',
          "", "[[registry]]", 'prefix = "docker.io"', f'location = "{hub.address}"',
          "insecure = true")
    job, logs = _run(yard, "short", f"{name}:1")
    assert job["state"] == "succeeded", f"{job}\n{logs}"
    assert "ran in root:x:0:" in logs, logs
    assert (f"image {name}:1 is a short name: docker.io/library/{name}:1, as Docker reads it"
            in logs), logs
    assert podman_engine.has_image(f"docker.io/library/{name}:1")


def test_the_nodes_search_registries_decide(yard: Yard, hub: Registry,
                                            podman_engine: PodmanEngine,
                                            test_images: ImageKit) -> None:
    name = f"searched-{secrets.token_hex(4)}"
    _pushed(hub, podman_engine, test_images, name)
    _conf(yard, hub, f'unqualified-search-registries = ["{hub.address}"]')
    job, logs = _run(yard, "searched", f"{name}:1")  # no docker.io mirror: Podman's search
    assert job["state"] == "succeeded", f"{job}\n{logs}"
    assert "as Docker reads it" not in logs, logs
    assert podman_engine.has_image(f"{hub.address}/{name}:1")


def test_the_nodes_aliases_decide(yard: Yard, hub: Registry, podman_engine: PodmanEngine,
                                  test_images: ImageKit) -> None:
    name = f"aliased-{secrets.token_hex(4)}"
    remote = _pushed(hub, podman_engine, test_images, f"team/{name}")
    _conf(yard, hub, "unqualified-search-registries = []", "",
          "[aliases]", f'"{name}" = "{remote.rsplit(":", 1)[0]}"')
    job, logs = _run(yard, "aliased", f"{name}:1")
    assert job["state"] == "succeeded", f"{job}\n{logs}"
    assert "as Docker reads it" not in logs and podman_engine.has_image(remote), logs
