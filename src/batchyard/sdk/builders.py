"""Builders for the common job shapes; each returns a validated :class:`JobSpec`.

    spec = pytorch_job("train.py", ["--epochs", "5"], nodes=2, processes_per_node=2,
                       code="examples/mnist-ddp", outputs=["MODEL"])
    job = Experiment.create(Workspace(), "mnist", exist_ok=True).submit(spec)
"""

from __future__ import annotations

from collections.abc import Sequence
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


def _shell(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv)
