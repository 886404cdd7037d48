"""Running one node's share of an attempt inside a container image (Docker or Podman).

One container per attempt per node, not one per rank: the ranks of a node share its
directories, its GPUs and its shared memory (PyTorch's data loaders, MPI's shared-memory
transport) exactly as they do without a container, MPI's daemons start their ranks inside
the container they run in, and one ``run`` per node keeps the start-up cost off every rank.
The container's own process only waits (``sleep infinity`` under the runtime's init); every
job process (preparation, ranks, the relay's MPI daemons) is started in it with ``exec`` by
the node launcher, which keeps their logs, exit codes and stop rules the same as on the bare
node. Host networking, so gloo, NCCL and MPI see the node's real interfaces; the job's
directories are bind-mounted at the same paths, so every path in the env contract holds
inside. Standard library only, like the launcher."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchyard.spec.containers import registry_of

RUNTIMES = ("docker", "podman")
DEFAULT_SHM = "2g"  # what AML gives a job's container; Docker's own 64m starves data loaders
PROBE_TTL = 30.0
PULL_TIMEOUT = 3600.0
LABEL = "batchyard.attempt"


@dataclass(frozen=True)
class Runtime:
    name: str  # docker | podman
    cli: tuple[str, ...]
    version: str

    def argv(self, *args: str) -> list[str]:
        return [*self.cli, *args]


_probed: dict[str, tuple[float, Runtime | None]] = {}


def find_runtime() -> Runtime | None:
    """The node's container runtime: ``BATCHYARD_CONTAINER_RUNTIME`` when the admin names
    one (``docker``, ``podman``, or ``none``), else Docker when its daemon answers, else
    Podman when it works. Found at run time
    (and again every PROBE_TTL seconds), so installing one needs no restart."""
    wanted = os.environ.get("BATCHYARD_CONTAINER_RUNTIME", "").strip().lower()
    if wanted == "none":  # the admin keeps this node's jobs out of containers
        return None
    key = wanted or "auto"
    cached = _probed.get(key)
    if cached and time.time() - cached[0] < PROBE_TTL:
        return cached[1]
    order = [wanted] if wanted in RUNTIMES else list(RUNTIMES)
    found = None
    for name in order:
        found = _probe(name)
        if found is not None:
            break
    _probed[key] = (time.time(), found)
    return found


def _probe(name: str) -> Runtime | None:
    binary = shutil.which(name)
    if binary is None:
        return None
    query = ("version", "--format", "{{.Server.Version}}") if name == "docker" else (
        "info", "--format", "{{.Version.Version}}")
    try:
        out = subprocess.run([binary, *query], capture_output=True, text=True, timeout=15,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = out.stdout.strip()
    if out.returncode != 0 or not version:
        return None
    return Runtime(name, (binary,), version)


def describe(runtime: Runtime | None) -> dict[str, Any] | None:
    """What a node reports about its runtime (shown by ``cluster node list``)."""
    if runtime is None:
        return None
    return {"runtime": runtime.name, "version": runtime.version, "images": image_count(runtime)}




_described: list[Any] = [0.0, None]


def node_containers() -> dict[str, Any] | None:
    """describe(find_runtime()), at most every PROBE_TTL seconds (agents send it with their
    heartbeats)."""
    if time.time() - _described[0] >= PROBE_TTL:
        _described[:] = [time.time(), describe(find_runtime())]
    return _described[1]


def image_count(runtime: Runtime) -> int | None:
    try:
        out = subprocess.run(runtime.argv("images", "-q"), capture_output=True, text=True,
                             timeout=15, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return len({line.strip() for line in out.stdout.splitlines() if line.strip()})


NO_RUNTIME = ("has no container runtime (neither a Docker daemon nor Podman answers), so it "
              "cannot run container jobs")


# --- what the container is ----------------------------------------------------------------

def container_name(attempt_uuid: str, node_rank: int) -> str:
    return f"by-{attempt_uuid.replace('-', '')[:16]}-{node_rank}"


def shm_size(value: str | None) -> str:
    return (value or DEFAULT_SHM).lower()


def binds(paths: list[str], read_only: list[str] | None = None) -> list[tuple[str, str]]:
    """(path, mode) to bind-mount at the same path; a path under another one is covered by
    it, and read-write wins over read-only for the same path."""
    modes: dict[str, str] = {}
    for path in read_only or []:
        modes[os.path.normpath(path)] = "ro"
    for path in paths:
        modes[os.path.normpath(path)] = "rw"
    out: list[tuple[str, str]] = []
    for path in sorted(modes):
        if any(_under(path, kept) and modes[kept] == "rw" for kept, _ in out):
            continue
        out.append((path, modes[path]))
    return out


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def run_argv(runtime_name: str, cli: list[str], *, image: str, name: str, attempt_uuid: str,
             node_rank: int, job_name: str, mounts: list[tuple[str, str]],
             shm: str | None, gpus: list[int | str] | None, user: str | None = None,
             pids: int | None = None) -> list[str]:
    """The ``docker run``/``podman run`` line of one node (``--dry-run`` prints this);
    ``pids``: the job's limits.max_pids on the node."""
    argv = [*cli, "run", "-d", "--rm", "--name", name, "--network", "host", "--init",
            "--shm-size", shm_size(shm), "--label", f"{LABEL}={attempt_uuid}",
            "--label", f"batchyard.node_rank={node_rank}", "--label", f"batchyard.job={job_name}"]
    if pids:
        argv += ["--pids-limit", str(pids)]
    if user:
        argv += ["--user", user]
    for path, mode in mounts:
        argv += ["-v", f"{path}:{path}:{mode}"]
    if gpus:
        ids = ",".join(str(g) for g in gpus)
        if runtime_name == "docker":
            argv += ["--gpus", f'"device={ids}"']
        else:
            for gpu in gpus:
                argv += ["--device", f"nvidia.com/gpu={gpu}"]
        argv += ["-e", f"NVIDIA_VISIBLE_DEVICES={ids}"]
    argv += ["--entrypoint", "sleep", image, "infinity"]
    return argv


def exec_argv(cli: list[str], name: str, env_keys: list[str], workdir: str,
              argv: list[str]) -> list[str]:
    """``exec`` one job process. Variables go by name only (``-e KEY``: the runtime reads the
    value from its own environment), so no secret is ever on a command line."""
    out = [*cli, "exec", "-w", workdir]
    for key in sorted(env_keys):
        out += ["-e", key]
    return [*out, name, *argv]


def render(argv: list[str]) -> str:
    return shlex.join(argv)


# --- pulling ------------------------------------------------------------------------------

def auth_config(image: str, registry: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Docker-style auth file (both runtimes read it) for the image's registry."""
    if not registry or not registry.get("username") or not registry.get("password"):
        return None
    server = registry.get("server") or registry_of(image) or "https://index.docker.io/v1/"
    token = base64.b64encode(
        f"{registry['username']}:{registry['password']}".encode()).decode()
    return {"auths": {server: {"auth": token}}}


def inspect_image(runtime: Runtime, image: str) -> dict[str, str] | None:
    """The image's own environment (its PATH above all: the ranks' PATH inside), or None
    when the node does not have the image. One call: it is on every container job's path."""
    try:
        out = subprocess.run(runtime.argv("image", "inspect", "--format",
                                          "{{json .Config.Env}}", image),
                             capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        pairs = json.loads(out.stdout.strip() or "null") or []
    except ValueError:
        pairs = []
    env = {}
    for pair in pairs:
        key, _, value = str(pair).partition("=")
        env[key] = value
    return env


def pull_argv(runtime: Runtime, image: str, authfile: Path | None) -> tuple[list[str],
                                                                           dict[str, str]]:
    """(argv, extra environment) of the pull: Docker reads ``$DOCKER_CONFIG/config.json``,
    Podman takes ``--authfile``; Podman speaks plain HTTP only to loopback registries, as
    Docker does by itself."""
    if runtime.name == "docker":
        env = {"DOCKER_CONFIG": str(authfile.parent)} if authfile else {}
        return runtime.argv("pull", "-q", image), env
    argv = runtime.argv("pull", "-q")
    if authfile:
        argv += ["--authfile", str(authfile)]
    host = (registry_of(image) or "").split(":")[0]
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        argv += ["--tls-verify=false"]
    return [*argv, image], {}


class PullError(Exception):
    pass


def effective_image(runtime: Runtime, image: str, environ: dict[str, str]) -> str:
    """The name the runtime is given for the job's image: a short name qualified as Docker
    does (``docker.io/library/busybox``) on Podman, unless the node has an image by that
    name or its registries configuration resolves the name (node/shortnames.py)."""
    from batchyard.node import shortnames

    if runtime.name != "podman" or registry_of(image) is not None:
        return image
    if inspect_image(runtime, image) is not None \
            or shortnames.podman_rules(environ).resolves(image):
        return image
    return shortnames.docker_qualified(image)


def ensure_image(runtime: Runtime, image: str, policy: str, registry: dict[str, Any] | None,
                 scratch: Path, environ: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Pull per the job's policy; returns what was done ("cached" or "pulled") and the
    image's environment. Credentials live only in a 0700 scratch directory for the length
    of the pull."""
    found = inspect_image(runtime, image) if policy != "always" else None
    if found is not None:
        return "cached", found
    if policy == "never":
        raise PullError(f"image {image} is not on this node and the job's pull_policy is "
                        "never")
    auth = auth_config(image, registry)
    authfile = None
    if auth is not None:
        scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(scratch, 0o700)
        authfile = scratch / "config.json"
        fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(auth, fh)
    try:
        argv, extra = pull_argv(runtime, image, authfile)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=PULL_TIMEOUT,
                                 env={**environ, **extra}, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise PullError(f"pulling image {image} timed out after {PULL_TIMEOUT:g}s") from exc
        if out.returncode != 0:
            said = " ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
            password = (registry or {}).get("password")
            if password:
                said = said.replace(str(password), "***")
            said = said or f"exit code {out.returncode}"
            raise PullError(f"pulling image {image} failed: {said}")
    finally:
        if authfile is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return "pulled", inspect_image(runtime, image) or {}


# --- the container's life -----------------------------------------------------------------

class StartError(Exception):
    """The image is on the node but its container would not start: the job's (or the
    node's) fault, not the registry's."""


def start(runtime: Runtime, argv: list[str], environ: dict[str, str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=environ,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise StartError("starting the container timed out after 300s") from exc
    if out.returncode != 0:
        said = " ".join(out.stderr.strip().splitlines()[-3:]) or f"exit code {out.returncode}"
        raise StartError(f"starting the container failed: {said}")
    ident = out.stdout.strip()
    if not _running(runtime, ident, environ):  # its init could not start the waiting process
        said = _logs(runtime, ident, environ)
        remove(runtime, ident)  # --rm's own clean-up runs later, if at all, on a busy node
        raise StartError("starting the container failed: it stopped at once" + (
            f": {said}" if said else " (it waits with the image's `sleep`: the image must "
            "have one)"))
    return ident


def _running(runtime: Runtime, ident: str, environ: dict[str, str]) -> bool:
    try:
        out = subprocess.run(runtime.argv("inspect", "--format", "{{.State.Running}}", ident),
                             capture_output=True, text=True, timeout=60, env=environ,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return True  # cannot tell: the first exec will say
    return out.returncode == 0 and out.stdout.strip() == "true"


def _logs(runtime: Runtime, ident: str, environ: dict[str, str]) -> str:
    try:
        out = subprocess.run(runtime.argv("logs", "--tail", "3", ident), capture_output=True,
                             text=True, timeout=60, env=environ, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return " ".join((out.stderr + out.stdout).strip().splitlines()[-3:]) \
        if out.returncode == 0 else ""


def remove(runtime: Runtime, name: str) -> None:
    """Kill and remove; quietly nothing when it is already gone."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(runtime.argv("rm", "-f", name), capture_output=True, timeout=120,
                       stdin=subprocess.DEVNULL)


def remove_attempt(attempt_uuid: str, node_rank: int | None = None) -> int:
    """What a sweeper calls after a launcher died without its teardown: remove its
    containers, found by label. Returns how many were removed."""
    runtime = find_runtime()
    if runtime is None:
        return 0
    filters = ["--filter", f"label={LABEL}={attempt_uuid}"]
    if node_rank is not None:
        filters += ["--filter", f"label=batchyard.node_rank={node_rank}"]
    try:
        out = subprocess.run(runtime.argv("ps", "-aq", *filters), capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    ids = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    for ident in ids:
        remove(runtime, ident)
    return len(ids)
