"""The container kit's engines (tests/containerkit.py): what Docker and Podman have in
common, our own dockerd, and Podman on our own store and configs."""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ck_common import (
    DOCKER_RUN,
    DOCKER_STORE,
    PODMAN_RUN,
    PODMAN_STORE,
    REPO_PREFIX,
    _clean_env,
    _cmdline,
    _die_with_parent,
    _HeldLock,
    _kill_pids,
    _pids_mentioning,
    _private_dir,
    _root_reason,
    _umount_under,
    _which,
)

if TYPE_CHECKING:
    from hostkit import Host


# -- engines ----------------------------------------------------------------------------------

class Engine:
    """What docker and podman have in common here. ``cli`` (argv prefix) and ``env`` (to pass
    to whatever runs the CLI, e.g. servers and agents) are all a caller needs."""

    name: ClassVar[str]

    def __init__(self, binary: str, host: Host | None = None) -> None:
        self.binary = binary
        self.host = host
        self.cli: list[str] = [binary]
        self.env: dict[str, str] = {}
        self.persistent = False
        self.imported: set[str] = set()  # kit images known to be in this engine's store

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def full_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """os.environ without other engines' settings, plus ours (and ``extra``)."""
        return _clean_env({**self.env, **(extra or {})})

    def run(self, args: Sequence[str | Path], check: bool = True, timeout: float = 180,
            input: str | None = None, env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """``CLI ARGS`` (inside ``host`` if the engine belongs to one)."""
        argv = [*self.cli, *map(str, args)]
        if self.host is not None:
            argv = self.host.enter(argv)
        p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout,
                           env=self.full_env(env),
                           stdin=None if input is not None else subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise AssertionError(f"{self.name} {shlex.join(map(str, args))} failed "
                                 f"(rc {p.returncode}): {(p.stderr or p.stdout).strip()[-2000:]}")
        return p

    def qualify(self, image: str) -> str:
        return image

    def has_image(self, ref: str) -> bool:
        return self.run(["image", "inspect", "--format", "{{.Id}}", ref], check=False
                        ).returncode == 0

    def images(self) -> list[tuple[str, str]]:
        """(id, repository:tag) of every image (``<none>:<none>`` for dangling ones)."""
        out = self.run(["images", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}"]
                       ).stdout
        return [(line.split()[0], line.split()[1]) for line in out.splitlines() if line.strip()]

    def remove_images(self, repo: str, keep: str) -> None:
        """Other tags of ``repo`` (older recipes) go, so persistent stores stay small."""
        for _id, ref in self.images():
            if ref.rsplit(":", 1)[0] == repo and ref != keep:
                self.run(["rmi", "-f", ref], check=False)

    def container_ids(self) -> list[str]:
        return self.run(["ps", "-aq", "--no-trunc"]).stdout.split()

    def remove_containers(self) -> None:
        if ids := self.container_ids():
            self.run(["rm", "-f", *ids], check=False, timeout=120)

    def remove_foreign_images(self) -> None:
        """Every image that is not one of the kit's (derived, pulled, pushed-tag ones)."""
        ours = self.qualify(REPO_PREFIX)
        drop = [ref if not ref.startswith("<none>") else i for i, ref in self.images()
                if not ref.startswith(ours)]
        if drop:
            self.run(["rmi", "-f", *drop], check=False, timeout=120)

    def import_image(self, tar: Path, name: str, changes: Sequence[str]) -> None:
        self.run(["import", *(a for c in changes for a in ("--change", c)), tar, name],
                 timeout=600)

    def build(self, context: Path, containerfile: str, name: str, args: Mapping[str, str],
              timeout: float) -> None:
        raise NotImplementedError


def _docker_reason() -> str | None:
    if reason := _root_reason():
        return reason
    if missing := [b for b in ("dockerd", "containerd", "runc") if not _which(b)]:
        return f"docker tests need {', '.join(missing)} (apt-get install docker.io)"
    if not _docker_client():
        return "docker tests need a docker CLI (apt-get install docker.io)"
    return None


def _docker_client() -> str | None:
    """Debian's client (/usr/bin/docker, 20.10 like the daemon) if there, else PATH's.

    /usr/local/bin/docker here is a client-only 28.x: it comes first on PATH and negotiates
    API 1.41 with Debian's dockerd fine (run, exec, login, push, pull), but its ``build`` wants
    buildx (absent), so the kit uses Debian's client and passes DOCKER_BUILDKIT=0."""
    if os.access("/usr/bin/docker", os.X_OK):
        return "/usr/bin/docker"
    return shutil.which("docker")


class DockerEngine(Engine):
    """A ``dockerd`` of our own: own data root, exec root, socket, pidfile, containerd
    namespace, config file; no bridge, no iptables, no ip_forward change.

    ``host`` (a hostkit Host): the daemon runs inside that host, so ``--network host``
    containers get that host's interfaces and hostname (one daemon is one network namespace).
    ``insecure_registries``: addresses other than 127.0.0.0/8 (which dockerd already allows
    over plain HTTP) to pull from without TLS. ``driver``: force overlay2 or vfs."""

    name = "docker"

    def __init__(self, host: Host | None = None, insecure_registries: Sequence[str] = (),
                 driver: str | None = None, persistent: bool | None = None,
                 timeout: float = 60) -> None:
        super().__init__(binary=_docker_client() or "docker", host=host)
        self.insecure_registries = list(insecure_registries)
        self.drivers = [driver] if driver else ["overlay2", "vfs"]
        self.driver = ""
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.session = _private_dir("containerkit-docker-")
        self.log = self.session / "dockerd.log"
        want = host is None and persistent is not False and not os.environ.get(
            "CONTAINERKIT_EPHEMERAL")
        self._lock = _HeldLock(DOCKER_STORE.with_suffix(".lock")) if want else None
        self.persistent = bool(self._lock and self._lock.held)
        self.data_root = self.exec_root = Path()
        self.start_seconds = 0.0
        self._closed = False
        atexit.register(self.close)

    def _dirs(self, driver: str) -> None:
        if self.persistent:
            self.data_root, self.exec_root = DOCKER_STORE / driver, DOCKER_RUN
        else:
            self.data_root = self.session / "data"
            self.exec_root = _private_dir("bytd-", Path("/run"))
        self.data_root.mkdir(parents=True, exist_ok=True)
        self.exec_root.mkdir(parents=True, exist_ok=True)
        self.sock = self.exec_root / "docker.sock"
        self.pidfile = self.exec_root / "docker.pid"
        self.cli = [self.binary, "-H", f"unix://{self.sock}"]
        self.env = {"DOCKER_HOST": f"unix://{self.sock}"}

    def _stop_stale(self) -> None:
        """A dockerd of a dead session on our persistent dirs (we hold the store's lock)."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.pidfile.read_text().strip())
            if str(self.data_root) in _cmdline(pid):
                _kill_pids([pid], grace=20)
        if strays := _pids_mentioning([self.exec_root, self.data_root]):
            _kill_pids(strays)
        _umount_under([self.exec_root, self.data_root])

    def start(self) -> DockerEngine:
        t0 = time.monotonic()
        errors = []
        try:
            for driver in self.drivers:
                self._dirs(driver)
                if self.persistent:
                    self._stop_stale()
                try:
                    self._start_daemon(driver)
                except RuntimeError as e:
                    errors.append(f"{driver}: {e}")
                    self._stop_daemon()
                    continue
                self.driver = driver
                break
            else:
                raise RuntimeError("dockerd did not start: " + "; ".join(errors))
            self.remove_containers()  # a crashed session's
            self.start_seconds = time.monotonic() - t0
            return self
        except BaseException:
            self.close()
            raise

    def _start_daemon(self, driver: str) -> None:
        conf = self.session / "daemon.json"
        conf.write_text("{}\n")  # never /etc/docker/daemon.json
        argv = ["dockerd", f"--config-file={conf}", f"--data-root={self.data_root}",
                f"--exec-root={self.exec_root}", f"--pidfile={self.pidfile}",
                f"--host=unix://{self.sock}", f"--storage-driver={driver}",
                "--containerd-namespace=batchyard-test",
                "--containerd-plugins-namespace=batchyard-test-plugins",
                "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false",
                "--ip-masq=false", "--userland-proxy=false", "--shutdown-timeout=5",
                "--exec-opt=native.cgroupdriver=cgroupfs", "--log-level=warn",
                *(f"--insecure-registry={r}" for r in self.insecure_registries)]
        with open(self.log, "ab") as log:
            if self.host is not None:
                self.proc = self.host.popen(argv, env=_clean_env(), stdout=log, stderr=log)
            else:
                self.proc = subprocess.Popen(argv, env=_clean_env(), stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=log, start_new_session=True,
                                             preexec_fn=_die_with_parent)
        deadline = time.monotonic() + self.timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited (rc {self.proc.returncode}): {self.tail()}")
            if self.sock.exists():
                p = self.run(["info", "--format", "{{.Driver}}"], check=False, timeout=20)
                if p.returncode == 0:
                    if p.stdout.strip() != driver:
                        raise RuntimeError(f"dockerd uses {p.stdout.strip()}, not {driver}")
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"dockerd not answering after {self.timeout:g}s: {self.tail()}")
            time.sleep(0.1)

    def _stop_daemon(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            self.proc = None
        if self.exec_root != Path():
            # containerd and shims it left (they name our exec root), then its mounts
            if strays := _pids_mentioning([self.exec_root, self.data_root]):
                _kill_pids(strays)
            _umount_under([self.exec_root, self.data_root])

    def close(self) -> None:
        """Idempotent: containers and non-kit images removed, dockerd stopped by pid, its
        containerd and shims (if any survived) killed by pid, mounts undone, temp dirs gone."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(Exception):
                    self.remove_containers()
                    self.remove_foreign_images()
                    self.run(["image", "prune", "-f"], check=False)
        finally:
            self._stop_daemon()
            if not self.persistent and self.exec_root != Path():
                shutil.rmtree(self.exec_root, ignore_errors=True)
            if not os.environ.get("CONTAINERKIT_KEEP"):
                shutil.rmtree(self.session, ignore_errors=True)
            if self._lock is not None:
                self._lock.release()

    def tail(self, n: int = 15) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return "(no log)"

    def build(self, context: Path, containerfile: str, name: str, args: Mapping[str, str],
              timeout: float) -> None:
        self.run(["build", "--network", "host", "-q", "-f", context / containerfile,
                  *(a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")),
                  "-t", name, context], timeout=timeout, env={"DOCKER_BUILDKIT": "0"})


def _podman_reason() -> str | None:
    if reason := _root_reason():
        return reason
    if missing := [b for b in ("podman", "conmon", "runc", "catatonit") if not _which(b)]:
        return f"podman tests need {', '.join(missing)} (apt-get install podman catatonit runc)"
    return None


_insecure: list[str] = []  # registries (host:port) every PodmanEngine trusts over plain HTTP
_podmans: list[PodmanEngine] = []


def _trust_insecure(address: str) -> None:
    if address not in _insecure:
        _insecure.append(address)
    for p in _podmans:
        p.write_registries_conf()


class PodmanEngine(Engine):
    """Podman with our containers.conf, storage.conf and registries.conf (``env``).

    The store is shared by every process using ``env`` (there is no daemon). ``driver``:
    force overlay or vfs (default: overlay, if the kernel's works here)."""

    name = "podman"

    def __init__(self, driver: str | None = None, persistent: bool | None = None) -> None:
        super().__init__(binary=_which("podman") or "podman")
        self.cli = [self.binary]
        self.drivers = [driver] if driver else ["overlay", "vfs"]
        self.driver = ""
        self.session = _private_dir("containerkit-podman-")
        want = persistent is not False and not os.environ.get("CONTAINERKIT_EPHEMERAL")
        self._lock = _HeldLock(PODMAN_STORE.with_suffix(".lock")) if want else None
        self.persistent = bool(self._lock and self._lock.held)
        self.conf = self.session / "containers.conf"
        self.storage_conf = self.session / "storage.conf"
        self.registries_conf = self.session / "registries.conf"
        self.graphroot = self.runroot = Path()
        self.env = {"CONTAINERS_CONF": str(self.conf),
                    "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
                    "CONTAINERS_REGISTRIES_CONF": str(self.registries_conf)}
        self.start_seconds = 0.0
        self._closed = False
        atexit.register(self.close)

    def qualify(self, image: str) -> str:
        """Podman's full name of a short one: ``local/x`` is ``localhost/local/x``."""
        first = image.split("/", 1)[0]
        if "/" in image and ("." in first or ":" in first or first == "localhost"):
            return image
        return f"localhost/{image}"

    def write_registries_conf(self) -> None:
        lines = ["# containerkit: no short-name search; our test registries over plain HTTP",
                 "unqualified-search-registries = []", 'short-name-mode = "permissive"', ""]
        for addr in _insecure:
            lines += ["[[registry]]", f'location = "{addr}"', "insecure = true", ""]
        tmp = self.registries_conf.with_suffix(".tmp")
        tmp.write_text("\n".join(lines))
        os.replace(tmp, self.registries_conf)

    def _write_confs(self, driver: str) -> None:
        if self.persistent:
            self.graphroot, self.runroot = PODMAN_STORE / driver, PODMAN_RUN / driver
        else:
            self.graphroot = self.session / "storage"
            self.runroot = _private_dir("bytp-", Path("/run"))
        for d in (self.graphroot, self.runroot, self.session / "networks"):
            d.mkdir(parents=True, exist_ok=True)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = min(1048576, hard if hard != resource.RLIM_INFINITY else 1048576)
        nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        nproc = min(32768, nproc_hard if nproc_hard != resource.RLIM_INFINITY else 32768)
        catatonit = _which("catatonit") or "/usr/bin/catatonit"
        self.conf.write_text(f"""# containerkit (tests/containerkit.py)
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
init_path = "{catatonit}"
log_driver = "k8s-file"
# without --network, a container gets only lo (as with our dockerd's --bridge=none), never a
# netavark bridge with iptables rules in the machine's namespace
netns = "none"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{self.session}/events.log"
tmp_dir = "{self.runroot}/libpod"

[network]
network_config_dir = "{self.session}/networks"
""")
        self.storage_conf.write_text(f"""# containerkit (tests/containerkit.py)
[storage]
driver = "{driver}"
graphroot = "{self.graphroot}"
runroot = "{self.runroot}"
""")
        self.write_registries_conf()

    def start(self) -> PodmanEngine:
        t0 = time.monotonic()
        errors = []
        try:
            _podmans.append(self)
            for driver in self.drivers:
                self._write_confs(driver)
                p = self.run(["info", "--format", "{{.Store.GraphDriverName}}"], check=False,
                             timeout=60)
                if p.returncode == 0 and p.stdout.strip() == driver:
                    self.driver = driver
                    break
                errors.append(f"{driver}: {(p.stderr or p.stdout).strip()[-500:]}")
                self._cleanup_store()
            else:
                raise RuntimeError("podman does not work here: " + "; ".join(errors))
            self.remove_containers()  # a crashed session's
            self.start_seconds = time.monotonic() - t0
            return self
        except BaseException:
            self.close()
            raise

    def remove_containers(self) -> None:
        self.run(["rm", "-a", "-f", "-t", "0"], check=False, timeout=120)

    def _cleanup_store(self) -> None:
        if self.graphroot == Path():
            return
        if strays := _pids_mentioning([self.runroot, self.graphroot]):  # conmon and the like
            _kill_pids(strays)
        _umount_under([self.runroot, self.graphroot])
        if not self.persistent:
            shutil.rmtree(self.runroot, ignore_errors=True)
            shutil.rmtree(self.graphroot, ignore_errors=True)

    def close(self) -> None:
        """Idempotent: containers and non-kit images removed, leftover conmons killed by pid,
        mounts undone, temporary store and configs gone."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            if self.driver:
                with contextlib.suppress(Exception):
                    self.remove_containers()
                    self.remove_foreign_images()
                    self.run(["image", "prune", "-f"], check=False)
        finally:
            with contextlib.suppress(ValueError):
                _podmans.remove(self)
            self._cleanup_store()
            if not os.environ.get("CONTAINERKIT_KEEP"):
                shutil.rmtree(self.session, ignore_errors=True)
            if self._lock is not None:
                self._lock.release()

    def build(self, context: Path, containerfile: str, name: str, args: Mapping[str, str],
              timeout: float) -> None:
        self.run(["build", "--network", "host", "--pull=never", "-q", "-f",
                  context / containerfile,
                  *(a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")),
                  "-t", name, context], timeout=timeout)
