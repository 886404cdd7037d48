"""Real container runtimes for tests: a hand-started ``dockerd``, Podman, locally built images
and a private image registry. No mocks, nothing pulled from the internet.

Fixtures (session scope; import them into a test module and name them in ``__all__``)::

    from containerkit import DockerEngine, ImageKit, Registry, docker_engine, test_images
    __all__ = ["docker_engine", "test_images"]

    def test_x(docker_engine: DockerEngine, test_images: ImageKit) -> None:
        image = test_images.name("mpich", docker_engine)  # built/imported on first use
        docker_engine.run(["run", "--rm", "--network", "host", image, "mpirun", "--version"])

- ``docker_engine`` (DockerEngine): our own ``dockerd`` (own data root, exec root, pidfile,
  socket, containerd namespace; ``--bridge=none --iptables=false --ip-forward=false``: jobs use
  ``--network host``; overlay2, else vfs). ``.cli`` is the argv prefix (``/usr/bin/docker -H
  unix://SOCK``), ``.env`` ``{"DOCKER_HOST": "unix://SOCK"}``, ``.name`` ``"docker"``. One
  dockerd is one network namespace: ``--network host`` is the daemon's. For a multi-host test
  start one per hostkit host, ``DockerEngine(host=h).start()`` (close it yourself).
- ``podman_engine`` (PodmanEngine): no daemon; ``.env`` names our own containers.conf (runc,
  cgroupfs, file events, k8s-file logs, catatonit, ulimits this machine allows, and no network
  but lo without ``--network``), storage.conf (own graphroot/runroot, so test images never
  reach the machine's default store) and registries.conf (our registries marked insecure).
  ``.cli`` is ``[/usr/bin/podman]``. Started inside a hostkit host (``host.run(...,
  env=podman_engine.full_env())``, i.e. nsenter), ``--network host`` is that host's namespace
  and hostname; under ``ip netns exec`` runc fails (/sys remounted: no cgroup fs).
- ``test_images`` (ImageKit): rootfs tarballs built once per machine and cached under
  ``/var/cache/batchyard-tests/images`` by a hash of their recipe, imported into an engine on
  first use: ``base`` (debootstrap minbase bookworm + python3, numpy, procps, iproute2),
  ``mpich`` (base + MPICH 5 and mpi4py from PyPI wheels, scikit-learn), ``openmpi`` (base +
  Debian's openmpi-bin and python3-mpi4py), ``tiny`` (busybox only, ~1 MB: cheap to push and
  pull) and ``torch`` (base + PyTorch CPU and scikit-learn; ~1 GB, build it through the
  ``torch_image`` fixture). Exact names: ``test_images.name(kind, engine)``, i.e.
  ``local/batchyard-KIND:HASH8`` for Docker and ``localhost/local/batchyard-KIND:HASH8`` for
  Podman. ``build_derived`` builds an image ``FROM`` one of them from a Containerfile.
- ``registry`` (Registry): Debian's ``docker-registry`` (distribution 2.8) on 127.0.0.1:PORT,
  plain HTTP, htpasswd auth (user ``batchyard``, random password). ``push(engine, image)``
  pushes with credentials; ``write_auth(dir)`` writes the docker-style config.json that
  ``DOCKER_CONFIG=dir docker pull`` and ``podman pull --authfile dir/config.json`` take (with
  the engine's ``env``, nothing else). A wrong password fails with "unauthorized:
  authentication required". ``Registry(host=h)`` serves inside a hostkit host instead (then
  give dockerds ``insecure_registries=[reg.address]``).

Engines keep their stores across sessions (``/var/lib/batchyard-test-docker``,
``/var/lib/batchyard-test-podman``) so a second run is fast; a session that finds the store in
use by another one gets a temporary store. Every session starts and ends with no container in
its store; images other than the kit's own (``*/local/batchyard-KIND``) are removed at the end.
Daemons are stopped by pid at session end, at exit, and die with the test process
(PR_SET_PDEATHSIG). Skips (never fails) without root or the binaries
(``scripts/setup.sh`` installs them). ``python tests/containerkit.py build base mpich openmpi``
builds the cached tarballs ahead of a test run.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

# the kit itself lives in ck_common, ck_engines, ck_images and ck_registry (tests/);
# its public names are re-exported here
import strictkit
from ck_common import CACHE as CACHE
from ck_common import DATA as DATA
from ck_common import DOCKER_RUN as DOCKER_RUN
from ck_common import DOCKER_STORE as DOCKER_STORE
from ck_common import IMAGE_PATH as IMAGE_PATH
from ck_common import KIT_VERSION as KIT_VERSION
from ck_common import PODMAN_RUN as PODMAN_RUN
from ck_common import PODMAN_STORE as PODMAN_STORE
from ck_common import REPO_PREFIX as REPO_PREFIX
from ck_common import SUITE as SUITE
from ck_common import USER as USER
from ck_engines import DockerEngine as DockerEngine
from ck_engines import Engine as Engine
from ck_engines import PodmanEngine as PodmanEngine
from ck_engines import _docker_reason, _podman_reason
from ck_images import RECIPES as RECIPES
from ck_images import ImageKit as ImageKit
from ck_images import KindImage as KindImage
from ck_images import Recipe as Recipe
from ck_images import apt_mirror as apt_mirror
from ck_images import images_unavailable as images_unavailable
from ck_registry import Registry as Registry
from ck_registry import _registry_reason

__all__ = ["docker_engine", "podman_engine", "registry", "test_images", "torch_image"]


# -- fixtures ---------------------------------------------------------------------------------

# Each module importing a fixture makes a fixture definition of its own, so a "session" fixture
# would be set up once per importing module: share one instance, counted (as slurmkit does).
_shared: dict[str, Any] = {}
_users: dict[str, int] = {}


@contextlib.contextmanager
def _session_shared(key: str, make: Callable[[], Any]) -> Iterator[Any]:
    if key not in _shared:
        _shared[key] = make()
    _users[key] = _users.get(key, 0) + 1
    try:
        yield _shared[key]
    finally:
        _users[key] -= 1
        if _users[key] == 0:
            obj = _shared.pop(key)
            if hasattr(obj, "close"):
                obj.close()


def _skip_if(reason: str | None) -> None:
    if reason:
        strictkit.missing(reason)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    """Our own dockerd for the session: ``.cli``, ``.env`` (DOCKER_HOST), ``.name``."""
    _skip_if(_docker_reason())
    with _session_shared("docker", lambda: DockerEngine().start()) as engine:
        yield engine


@pytest.fixture(scope="session")
def podman_engine() -> Iterator[PodmanEngine]:
    """Podman on our own store and configs: ``.cli``, ``.env`` (CONTAINERS_*), ``.name``."""
    _skip_if(_podman_reason())
    with _session_shared("podman", lambda: PodmanEngine().start()) as engine:
        yield engine


@pytest.fixture(scope="session")
def test_images() -> Iterator[ImageKit]:
    """Cached test images; ``test_images.name(kind, engine)`` builds/imports on first use."""
    _skip_if(images_unavailable())
    with _session_shared("images", ImageKit) as kit:
        yield kit


@pytest.fixture(scope="session")
def torch_image() -> Iterator[KindImage]:
    """The torch image's tarball, built now if not cached (minutes, ~1 GB):
    ``torch_image.name(engine)``."""
    _skip_if(images_unavailable())
    with _session_shared("images", ImageKit) as kit:
        kit.tarball("torch")
        yield KindImage(kit, "torch")


@pytest.fixture(scope="session")
def registry() -> Iterator[Registry]:
    """A private registry on 127.0.0.1: ``.address``, ``.username``, ``.password``,
    ``.push(engine, image)``, ``.write_auth(dir)``."""
    _skip_if(_registry_reason())
    with _session_shared("registry", lambda: Registry().start()) as reg:
        yield reg


def _main(argv: Sequence[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="containerkit", description="Build the cached test images.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or find cached) image tarballs")
    b.add_argument("kinds", nargs="*", default=["base", "mpich", "openmpi", "tiny"])
    sub.add_parser("list", help="cached tarballs of the current recipes")
    args = ap.parse_args(argv)
    kit = ImageKit()
    for kind in (args.kinds if args.cmd == "build" else list(RECIPES)):
        if args.cmd == "build":
            t0 = time.monotonic()
            path = kit.tarball(kind)
            print(f"{kind}: {path} ({path.stat().st_size / 1e6:.0f} MB, "
                  f"{time.monotonic() - t0:.1f}s)")
        else:
            path = kit.cache / "images" / f"{kind}-{kit.key(kind)[:16]}.tar"
            print(f"{kind}: {kit.repo(kind)}:{kit.tag(kind)} "
                  f"{path if path.exists() else '(not built)'}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
