"""azureml.train.dnn: the framework estimators and the distributed-training objects of the
Azure ML Compute era. Each estimator is :class:`Estimator` with its framework's backends; the
framework itself is whatever is installed where batchyard runs, or in the image given as
``custom_docker_image`` (no framework image is picked from ``framework_version``)."""

from __future__ import annotations

from typing import Any

from batchyard.compat.azureml.train.estimator import Estimator


class Mpi:
    """``distributed_training=Mpi()``: mpirun (Horovod, ChainerMN, mpi4py)."""

    def __init__(self, process_count_per_node: int = 1) -> None:
        self.process_count_per_node = process_count_per_node


class Gloo:
    """``distributed_training=Gloo()``: torch.distributed over gloo."""


class Nccl:
    """``distributed_training=Nccl()``: torch.distributed over nccl (gloo without GPUs)."""


class ParameterServer:
    """``distributed_training=ParameterServer(...)``: TensorFlow with TF_CONFIG."""

    def __init__(self, worker_count: int = 1, parameter_server_count: int = 1) -> None:
        self.worker_count = worker_count
        self.parameter_server_count = parameter_server_count


class PyTorch(Estimator):
    _framework = "PyTorch"
    _backends = ("mpi", "gloo", "nccl")


class Chainer(Estimator):
    _framework = "Chainer"
    _backends = ("mpi",)


class TensorFlow(Estimator):
    _framework = "TensorFlow"
    _backends = ("mpi", "ps", "parameter_server")

    def __init__(self, source_directory: str, compute_target: Any = None,
                 worker_count: int = 1, parameter_server_count: int = 1,
                 **kwargs: Any) -> None:
        backend = kwargs.get("distributed_backend")
        if backend is not None and backend.lower() in ("ps", "parameter_server"):
            kwargs["distributed_backend"] = None
            kwargs.setdefault("distributed_training",
                              ParameterServer(worker_count, parameter_server_count))
        super().__init__(source_directory, compute_target, **kwargs)
        self.worker_count = worker_count
        self.parameter_server_count = parameter_server_count


__all__ = ["Chainer", "Gloo", "Mpi", "Nccl", "ParameterServer", "PyTorch", "TensorFlow"]
