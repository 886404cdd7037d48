"""Builders for the common job shapes; each returns a validated :class:`JobSpec`.

    spec = pytorch_job("train.py", ["--epochs", "5"], nodes=2, processes_per_node=2,
                       code="examples/mnist-ddp", outputs=["MODEL"])
    job = Experiment.create(Workspace(), "mnist", exist_ok=True).submit(spec)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchyard.sdk import pip
from batchyard.spec.job import JobSpec


def command_job(command: str | list[str], *, nodes: int = 1, processes_per_node: int = 1,
                distribution: str = "pytorch", process_count: int | None = None,
                backend: str = "auto", code: str | None = None,
                env: dict[str, str] | None = None, secrets: dict[str, str] | None = None,
                inputs: dict[str, str] | None = None,
                outputs: Sequence[str] | dict[str, Any] | None = None,
                prepare: str | list[str] | None = None,
                pip_packages: Sequence[str] | None = None,
                max_wall_clock: float | str | None = None, max_retries: int = 0,
                name: str | None = None, experiment: str | None = None,
                cluster: str | None = None, priority: str = "normal",
                tags: dict[str, str] | None = None, python: str | None = None,
                **distribution_extra: Any) -> JobSpec:
    """Any command under any distribution. ``pip_packages`` are installed per node into the
    job's own directory (see :mod:`batchyard.sdk.pip`), never into a shared interpreter."""
    dist: dict[str, Any] = {"type": distribution, "processes_per_node": processes_per_node,
                            "backend": backend, **distribution_extra}
    if process_count is not None:
        dist["process_count"] = process_count
    steps: list[str] = []
    if prepare is not None:
        steps.append(prepare if isinstance(prepare, str) else _shell(prepare))
    if pip_packages:
        steps.append(pip.prepare_command(pip_packages))
        command = pip.wrap_command(command)
    limits: dict[str, Any] = {"max_retries": max_retries}
    if max_wall_clock is not None:
        limits["max_wall_clock"] = max_wall_clock
    data: dict[str, Any] = {
        "name": name, "experiment": experiment, "cluster": cluster, "nodes": nodes,
        "distribution": dist, "command": command, "code": code, "env": env or {},
        "secrets": secrets or {}, "inputs": inputs or {},
        "outputs": outputs if isinstance(outputs, dict) else {o: {} for o in outputs or ()},
        "limits": limits, "priority": priority, "tags": tags or {},
        "environment": {"python": python} if python else {},
    }
    if steps:
        data["prepare"] = " && ".join(steps) if len(steps) > 1 else steps[0]
    return JobSpec.model_validate({k: v for k, v in data.items() if v is not None})


def python_job(script: str, args: Sequence[Any] = (), **options: Any) -> JobSpec:
    """``python SCRIPT ARGS`` on every rank (``distribution`` defaults to pytorch)."""
    return command_job(["python", script, *[str(a) for a in args]], **options)


def pytorch_job(script: str, args: Sequence[Any] = (), *, nodes: int = 1,
                processes_per_node: int = 1, backend: str = "auto", **options: Any) -> JobSpec:
    """torch.distributed: every rank gets torchrun's environment; gloo on CPU, nccl on GPU."""
    return python_job(script, args, nodes=nodes, processes_per_node=processes_per_node,
                      distribution="pytorch", backend=backend, **options)


def mpi_job(script: str, args: Sequence[Any] = (), *, nodes: int = 1,
            processes_per_node: int = 1, **options: Any) -> JobSpec:
    """Node 0 runs ``mpirun`` over all nodes (Horovod, ChainerMN, mpi4py)."""
    return python_job(script, args, nodes=nodes, processes_per_node=processes_per_node,
                      distribution="mpi", **options)


def tensorflow_job(script: str, args: Sequence[Any] = (), *, nodes: int = 1,
                   processes_per_node: int = 1, parameter_server_count: int = 0,
                   **options: Any) -> JobSpec:
    """Every task gets ``TF_CONFIG`` (chief, workers, parameter servers last)."""
    return python_job(script, args, nodes=nodes, processes_per_node=processes_per_node,
                      distribution="tensorflow",
                      parameter_server_count=parameter_server_count, **options)


def load_job(path: str | Path, *, ignore: Sequence[str] = ()) -> JobSpec:
    """A job file the CLI reads (native YAML, Batch AI ``job.json``, Azure ML v2 command
    YAML) as a :class:`JobSpec`; relative paths in it (``code: .``) resolve against the
    file's folder. ``ignore`` drops properties that cannot be honoured here, as
    ``job create --ignore`` does::

        spec = batchyard.load_job("examples/hello-distributed/job.yaml")
        spec.nodes = 1
        job = experiment.submit(spec)
    """
    from batchyard.spec.loader import load_job_file

    return load_job_file(Path(path), ignore=set(ignore))


def job_file_format(path: str | Path) -> str:
    """``native``, ``batchai`` or ``aml``: what the file is, told from its content."""
    from batchyard.spec.loader import detect_job_format, read_document

    data = read_document(Path(path))
    return detect_job_format(data) if isinstance(data, dict) else "native"


def _shell(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv)
