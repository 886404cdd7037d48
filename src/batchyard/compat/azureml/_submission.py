"""Turning an Estimator or ScriptRunConfig into a batchyard job spec (one place for both).

Azure ML's conventions carried over: the script runs in the snapshot of ``source_directory``;
``./outputs`` and ``./logs`` are kept with the run (each node's are links to the run's
``outputs`` and ``logs`` outputs, so ``run.download_file("outputs/model.pt")`` works);
``pip_packages`` are installed per node into the job's own directory; a container image
(``custom_docker_image``, ``Environment.docker.base_image``) runs as it is, pulled with its
registry's login (sealed at rest like every job secret).
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from batchyard.compat.azureml.exceptions import TrainingException, UnsupportedParameterError
from batchyard.sdk import pip
from batchyard.spec.containers import qualified, registry_host
from batchyard.spec.job import JobSpec

# Azure ML's kept folders -> the batchyard output ids that hold them
AML_OUTPUTS = {"outputs": "OUTPUTS", "logs": "LOGS"}
# Runs on every node before the ranks, in the job's working directory: ./outputs and ./logs
# become links to the run's kept directories (what a snapshot brought along is moved there).
OUTPUT_LINKS = " && ".join(
    f'mkdir -p "$BATCHYARD_OUTPUT_{i}" && {{ if [ -d {d} ] && [ ! -L {d} ]; then '
    f'cp -a {d}/. "$BATCHYARD_OUTPUT_{i}"/ && rm -rf {d}; fi; }} && '
    f'ln -sfn "$BATCHYARD_OUTPUT_{i}" {d}'
    for d, i in AML_OUTPUTS.items())


@dataclass
class Submission:
    spec: JobSpec
    source_directory: str
    compute_target: str | None


@dataclass
class Layout:
    """Nodes, ranks and the batchyard distribution block of a run."""

    node_count: int
    distribution: dict[str, Any] = field(default_factory=dict)


def new_run_id(experiment: str) -> str:
    """``<experiment>_<unix time>_<8 hex>``, as Azure ML named runs (at most 64 characters)."""
    suffix = f"_{int(time.time())}_{uuid.uuid4().hex[:8]}"
    return experiment[: 64 - len(suffix)] + suffix


def target_name(compute_target: Any) -> str | None:
    """A compute target object or name -> the cluster name (None: the workspace's only one)."""
    if compute_target is None:
        return None
    if isinstance(compute_target, str):
        if compute_target.lower() == "amlcompute":
            raise UnsupportedParameterError("compute_target='amlcompute'", "run-scoped compute "
                                            "is not created here; create a cluster with "
                                            "ComputeTarget.create and pass it")
        return None if compute_target.lower() == "local" else compute_target
    name = getattr(compute_target, "name", None)
    if not isinstance(name, str):
        raise TrainingException(f"compute_target: {compute_target!r} is not a compute target")
    return name


def layout(*, node_count: int, process_count_per_node: int, backend: str | None,
           training: Any, use_gpu: bool, where: str) -> Layout:
    """Estimator/ScriptRunConfig distribution settings -> nodes + batchyard distribution."""
    kind = type(training).__name__ if training is not None else None
    hint = "auto" if use_gpu else "gloo"
    if kind in ("MpiConfiguration", "Mpi"):
        ppn = int(getattr(training, "process_count_per_node", process_count_per_node) or 1)
        nodes = int(getattr(training, "node_count", 0) or node_count)
        return _mpi(nodes, ppn)
    if kind == "PyTorchConfiguration":
        nodes = int(training.node_count or node_count)
        total = int(training.process_count or nodes)
        if total % nodes:
            raise TrainingException(f"{where}: PyTorchConfiguration process_count {total} is not "
                                    f"a multiple of node_count {nodes}")
        backend_name = str(training.communication_backend or "").lower()
        chosen = backend_name if backend_name in ("gloo", "nccl") else hint
        if backend_name == "nccl" and not use_gpu:
            chosen = "auto"  # nccl on GPUs, gloo where there are none
        return Layout(nodes, {"type": "pytorch", "processes_per_node": total // nodes,
                              "backend": chosen})
    if kind in ("Gloo", "Nccl"):
        return Layout(node_count, {"type": "pytorch", "processes_per_node": process_count_per_node,
                                   "backend": "gloo" if kind == "Gloo" else "auto"})
    if kind in ("TensorflowConfiguration", "ParameterServer"):
        return _tensorflow(node_count, int(training.worker_count),
                           int(training.parameter_server_count))
    if training is not None:
        raise TrainingException(f"{where}: distributed_training {training!r} is not one of "
                                "MpiConfiguration, PyTorchConfiguration, "
                                "TensorflowConfiguration, Mpi, Gloo, Nccl, ParameterServer")
    if backend is None:
        if node_count > 1 or process_count_per_node > 1:
            raise TrainingException(f"{where}: node_count {node_count} x process_count_per_node "
                                    f"{process_count_per_node} needs distributed_backend "
                                    "('mpi', 'gloo', 'nccl', 'ps') or distributed_training")
        return Layout(1, {"type": "custom"})
    name = backend.lower()
    if name == "mpi":
        return _mpi(node_count, process_count_per_node)
    if name in ("gloo", "nccl"):
        return Layout(node_count, {"type": "pytorch", "processes_per_node": process_count_per_node,
                                   "backend": "gloo" if name == "gloo" else "auto"})
    raise TrainingException(f"{where}: distributed_backend {backend!r}: use 'mpi', 'gloo', "
                            "'nccl' (or 'ps' for TensorFlow)")


def _mpi(nodes: int, ppn: int) -> Layout:
    return Layout(nodes, {"type": "mpi", "processes_per_node": ppn, "process_count": nodes * ppn})


def _tensorflow(nodes: int, workers: int, ps: int) -> Layout:
    total = workers + ps
    nodes = max(1, min(nodes, total))
    return Layout(nodes, {"type": "tensorflow", "processes_per_node": math.ceil(total / nodes),
                          "process_count": total, "worker_count": workers,
                          "parameter_server_count": ps})


def script_arguments(params: dict[str, Any] | list[Any] | None) -> list[str]:
    """``script_params`` {'--epochs': 5, '--flag': ''} -> ['--epochs', '5', '--flag']."""
    if params is None:
        return []
    if isinstance(params, dict):
        out: list[str] = []
        for key, value in params.items():
            out.append(str(key))
            if value is not None and value != "":
                out.append(str(value))
        return out
    return [str(v) for v in params]


def data_inputs(values: list[Any]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """DataReferences (inputs=, or seen in arguments) -> spec inputs and their env vars."""
    inputs: dict[str, dict[str, str]] = {}
    env: dict[str, str] = {}
    for value in values:
        name = getattr(value, "data_reference_name", None)
        path = getattr(value, "local_path", None)
        if name and path:
            inputs[name] = {"path": str(path)}
            env[f"AZUREML_DATAREFERENCE_{name}"] = str(path)
    return inputs, env


@dataclass
class EnvironmentParts:
    """What an Environment (with an estimator's or a DockerConfiguration's container
    settings) gives the job: pip packages, variables, and the native ``environment`` block
    (python, image, registry, shm_size)."""

    pip_packages: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)


def environment_settings(environment: Any, where: str, *, docker: Any = None,
                         image: str | None = None, registry: Any = None,
                         shm_size: str | None = None) -> EnvironmentParts:
    """An Environment plus the container settings given beside it (an Estimator's
    ``custom_docker_image``/``image_registry_details``/``shm_size``, a DockerConfiguration)
    -> EnvironmentParts. An image runs as it is; what needs an image build
    (``base_dockerfile``) or runtime arguments is refused, naming it. ``docker.enabled`` and
    ``use_docker`` add nothing: on Azure ML compute every run was a container, here an image
    says so."""
    parts = EnvironmentParts()
    if environment is not None:
        parts = _python_parts(environment, f"{where} (environment "
                                           f"{getattr(environment, 'name', '?')})")
        section = getattr(environment, "docker", None)
        if section is not None:
            image, registry, shm_size = _docker_section(section, where, image, registry,
                                                        shm_size)
    if docker is not None:
        if getattr(docker, "arguments", None):
            raise UnsupportedParameterError("DockerConfiguration.arguments", _NO_ARGUMENTS,
                                            where)
        shm_size = getattr(docker, "shm_size", None) or shm_size
    login = _registry(registry, where)
    if not image:
        if login:
            raise TrainingException(f"{where}: a container registry is given but no image "
                                    "(custom_docker_image or environment.docker.base_image)")
        return parts  # no container: the ranks use the node's own /dev/shm
    parts.environment["image"] = qualified(image, login.get("server"))
    if login:
        parts.environment["registry"] = login
    if shm_size:
        parts.environment["shm_size"] = str(shm_size)
    return parts


_NO_ARGUMENTS = ("batchyard starts containers itself and passes no extra runtime arguments "
                 "(shm_size sets /dev/shm)")


def _python_parts(environment: Any, where: str) -> EnvironmentParts:
    python = environment.python
    deps = python.conda_dependencies
    conda = deps.packages_needing_conda()
    if conda:
        raise UnsupportedParameterError(
            [f"conda_packages ({', '.join(conda)})"], "there is no conda here; give them as "
            "pip_packages, install them in the image, or where batchyard runs", where)
    parts = EnvironmentParts(
        [p for p in deps.pip_packages if not p.lower().startswith("azureml")],
        dict(environment.environment_variables or {}))
    if python.user_managed_dependencies and python.interpreter_path not in ("python", ""):
        parts.environment["python"] = str(python.interpreter_path)
    return parts


def _docker_section(section: Any, where: str, image: str | None, registry: Any,
                    shm_size: str | None) -> tuple[str | None, Any, str | None]:
    """Environment.docker merged under what the estimator gave (which wins where both do)."""
    if section.base_dockerfile:
        raise UnsupportedParameterError(
            "environment.docker.base_dockerfile", "nothing builds images here: build it "
            "yourself, push it to a registry and give it as docker.base_image", where)
    if getattr(section, "arguments", None):
        raise UnsupportedParameterError("environment.docker.arguments", _NO_ARGUMENTS, where)
    base = section.base_image
    if image and base and image != base:
        raise TrainingException(f"{where}: custom_docker_image {image!r} and the "
                                f"environment's docker.base_image {base!r} differ; give one")
    if registry is None and _registry(getattr(section, "base_image_registry", None), where):
        registry = section.base_image_registry
    return image or base, registry, shm_size or getattr(section, "shm_size", None)


def _registry(registry: Any, where: str) -> dict[str, Any]:
    """A ContainerRegistry -> the native registry block ({} when nothing is set)."""
    if registry is None:
        return {}
    if getattr(registry, "registry_identity", None) is not None:
        raise UnsupportedParameterError("registry_identity", "there are no Azure managed "
                                        "identities here; give username and password", where)
    address = getattr(registry, "address", None)
    login = {"server": registry_host(address) if address else None,
             "username": getattr(registry, "username", None),
             "password": getattr(registry, "password", None)}
    return {k: v for k, v in login.items() if v}


def build(*, where: str, source_directory: str, command: list[str] | str,
          compute_target: Any, layout_: Layout, pip_packages: list[str],
          env: dict[str, str], inputs: dict[str, dict[str, str]],
          max_run_duration_seconds: float | None, tags: dict[str, str],
          python: str | None = None, environment: dict[str, Any] | None = None) -> Submission:
    """The job spec of a run; ``environment`` is EnvironmentParts.environment (``python``
    is the interpreter alone, for callers without one)."""
    root = Path(source_directory)
    if not root.is_dir():
        raise TrainingException(f"{where}: source_directory {source_directory!r} is not a "
                                "directory")
    if isinstance(command, list) and len(command) > 1 and command[0] == "python":
        script = command[1]
        if not (root / script).is_file():
            raise TrainingException(f"{where}: entry script {script!r} not found in "
                                    f"{source_directory}")
    prepare = OUTPUT_LINKS
    if pip_packages:
        try:
            prepare += " && " + pip.prepare_command(pip_packages)
        except Exception as exc:
            raise TrainingException(f"{where}: {exc}") from None
        command = pip.wrap_command(command)
    data: dict[str, Any] = {
        "nodes": layout_.node_count, "distribution": layout_.distribution, "command": command,
        "prepare": prepare, "env": {k: str(v) for k, v in env.items()}, "inputs": inputs,
        "outputs": {i: {} for i in AML_OUTPUTS.values()},
        "tags": {k: str(v) for k, v in tags.items()},
    }
    if max_run_duration_seconds:
        data["limits"] = {"max_wall_clock": float(max_run_duration_seconds)}
    block = {**({"python": python} if python else {}), **(environment or {})}
    if block:
        data["environment"] = block
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
                             for e in exc.errors())
        raise TrainingException(f"{where}: cannot make a batchyard job: {problems}") from None
    return Submission(spec, str(root), target_name(compute_target))


def aml_file_name(path: str) -> str:
    """batchyard's ``outputs/OUTPUTS/x`` -> Azure ML's ``outputs/x`` (likewise logs)."""
    for d, i in AML_OUTPUTS.items():
        prefix = f"outputs/{i}/"
        if path.startswith(prefix):
            return d + "/" + path[len(prefix):]
    return path
