"""azureml.train.estimator.Estimator: a script, its directory and how to distribute it,
turned into a batchyard job at submit.

Honoured: ``source_directory`` (snapshotted, ``.amlignore``/``.gitignore``, 300 MiB limit),
``entry_script``, ``script_params``, ``compute_target``, ``node_count``,
``process_count_per_node``, ``distributed_backend`` ('mpi' -> mpirun over all nodes with
node_count x process_count_per_node ranks; 'gloo'/'nccl' -> torch.distributed),
``distributed_training``, ``use_gpu`` (backend hint: nccl on GPUs, gloo otherwise),
``pip_packages``/``pip_requirements_file`` (installed per job), ``environment_variables``,
``environment_definition``, ``inputs``, ``max_run_duration_seconds``,
``custom_docker_image`` (or the older ``custom_docker_base_image``: the ranks run in that
image, used as it is, with no Azure ML layers built on it), ``image_registry_details`` (a
ContainerRegistry: its login pulls the image), ``shm_size`` (the container's /dev/shm).
Accepted with nothing to do: ``use_docker`` (an image says whether there is a container;
without one the ranks run on the node, using its /dev/shm), ``user_managed``,
``framework_version`` (recorded as a tag; the installed framework, or the image's, runs).
Refused with an error naming them: ``conda_packages``, conda files, ``vm_size``/``vm_priority``
(run-scoped compute), ``source_directory_data_store``, ``resume_from``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchyard.compat.azureml import _submission as sub
from batchyard.compat.azureml._common import refuse
from batchyard.compat.azureml.exceptions import TrainingException


class Estimator:
    _framework = "Python"
    _backends: tuple[str, ...] = ("mpi", "gloo", "nccl")

    def __init__(self, source_directory: str, compute_target: Any = None,
                 vm_size: str | None = None, vm_priority: str | None = None,
                 entry_script: str | None = None,
                 script_params: dict[str, Any] | None = None, node_count: int = 1,
                 process_count_per_node: int = 1, distributed_backend: str | None = None,
                 distributed_training: Any = None, use_gpu: bool = False,
                 use_docker: bool = True, custom_docker_base_image: str | None = None,
                 custom_docker_image: str | None = None, image_registry_details: Any = None,
                 user_managed: bool = False, conda_packages: list[str] | None = None,
                 pip_packages: list[str] | None = None,
                 conda_dependencies_file_path: str | None = None,
                 pip_requirements_file_path: str | None = None,
                 conda_dependencies_file: str | None = None,
                 pip_requirements_file: str | None = None,
                 environment_variables: dict[str, str] | None = None,
                 environment_definition: Any = None, inputs: list[Any] | None = None,
                 source_directory_data_store: Any = None, shm_size: str | None = None,
                 resume_from: Any = None, max_run_duration_seconds: float | None = None,
                 framework_version: str | None = None, **_private: Any) -> None:
        where = type(self).__name__
        refuse(where, "there is no conda here; give them as pip_packages, or install them "
               "where batchyard runs", conda_packages=conda_packages,
               conda_dependencies_file_path=conda_dependencies_file_path,
               conda_dependencies_file=conda_dependencies_file)
        refuse(where, "run-scoped compute is not created here; create a cluster with "
               "ComputeTarget.create and pass it as compute_target",
               vm_size=vm_size, vm_priority=vm_priority)
        refuse(where, "not available in batchyard",
               source_directory_data_store=source_directory_data_store,
               resume_from=resume_from)
        if distributed_backend is not None and distributed_backend.lower() not in self._backends:
            raise TrainingException(f"{where}: distributed_backend {distributed_backend!r}: use "
                                    f"one of {', '.join(self._backends)}")
        if custom_docker_image and custom_docker_base_image and \
                custom_docker_image != custom_docker_base_image:
            raise TrainingException(f"{where}: custom_docker_image and custom_docker_base_image "
                                    "name different images; give custom_docker_image")
        image = custom_docker_image or custom_docker_base_image
        if image and not use_docker:
            raise TrainingException(f"{where}: custom_docker_image runs in a container; drop "
                                    "use_docker=False")
        self.source_directory = source_directory
        self.compute_target = compute_target
        self.entry_script = entry_script
        self.script_params = dict(script_params or {})
        self.node_count = node_count
        self.process_count_per_node = process_count_per_node
        self.distributed_backend = distributed_backend
        self.distributed_training = distributed_training
        self.use_gpu = use_gpu
        self.use_docker = use_docker
        self.custom_docker_image = image
        self.image_registry_details = image_registry_details
        self.pip_packages = list(pip_packages or [])
        for path in (pip_requirements_file_path, pip_requirements_file):
            if path:
                base = Path(source_directory) if not Path(path).is_absolute() else Path()
                req = base / path if (base / path).is_file() else Path(path)
                self.pip_packages += [ln.split("#", 1)[0].strip()
                                      for ln in req.read_text().splitlines()
                                      if ln.split("#", 1)[0].strip()]
        self.environment_variables = dict(environment_variables or {})
        self.environment_definition = environment_definition
        self.inputs = list(inputs or [])
        self.max_run_duration_seconds = max_run_duration_seconds
        self.framework_version = framework_version
        self.shm_size = shm_size
        self.user_managed = user_managed

    def _layout(self) -> sub.Layout:
        return sub.layout(node_count=self.node_count,
                          process_count_per_node=self.process_count_per_node,
                          backend=self.distributed_backend, training=self.distributed_training,
                          use_gpu=self.use_gpu, where=type(self).__name__)

    def _to_submission(self, tags: dict[str, str] | None = None) -> sub.Submission:
        where = type(self).__name__
        if not self.entry_script:
            raise TrainingException(f"{where}: entry_script is required")
        parts = sub.environment_settings(self.environment_definition, where,
                                         image=self.custom_docker_image,
                                         registry=self.image_registry_details,
                                         shm_size=self.shm_size)
        refs = [v for v in self.script_params.values() if hasattr(v, "data_reference_name")]
        inputs, ref_env = sub.data_inputs(self.inputs + refs)
        all_tags = {"azureml.framework": self._framework, **(tags or {})}
        if self.framework_version:
            all_tags["azureml.framework_version"] = str(self.framework_version)
        command = ["python", self.entry_script, *sub.script_arguments(self.script_params)]
        return sub.build(where=where, source_directory=self.source_directory, command=command,
                         compute_target=self.compute_target, layout_=self._layout(),
                         pip_packages=self.pip_packages + parts.pip_packages,
                         env={**parts.env, **ref_env, **self.environment_variables},
                         inputs=inputs, max_run_duration_seconds=self.max_run_duration_seconds,
                         tags=all_tags, environment=parts.environment)

    def to_job_spec(self) -> Any:
        """The batchyard JobSpec this estimator submits (for a look, or a dry run)."""
        return self._to_submission().spec


__all__ = ["Estimator"]
