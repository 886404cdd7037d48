"""Azure ML v1 container settings -> the native ``environment`` block: Environment.docker
(base_image, base_image_registry, shm_size), Environment.from_docker_image, and the
Estimators' custom_docker_image / image_registry_details / shm_size. What needs an image
build or runtime arguments is refused naming it (all client-side: no server needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from batchyard.compat.azureml import _submission as sub
from batchyard.compat.azureml.core import Environment, ScriptRunConfig
from batchyard.compat.azureml.core.container_registry import ContainerRegistry
from batchyard.compat.azureml.core.runconfig import DockerConfiguration
from batchyard.compat.azureml.exceptions import TrainingException, UnsupportedParameterError
from batchyard.compat.azureml.train.dnn import PyTorch, TensorFlow
from batchyard.compat.azureml.train.estimator import Estimator

IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-cuda11.1-cudnn8-ubuntu18.04:20211012.v1"


@pytest.fixture
def src(tmp_path: Path) -> str:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    return str(tmp_path)


def acr(address: str | None = "myregistry.azurecr.io", username: str = "myregistry",
        password: str = "acr-s3cret") -> ContainerRegistry:
    registry = ContainerRegistry()
    registry.address, registry.username, registry.password = address, username, password
    return registry


def test_environment_docker_base_image(src: str) -> None:
    env = Environment("custom")
    env.docker.enabled = True  # fine now: the image says there is a container
    env.docker.base_image = IMAGE
    env.docker.shm_size = "4g"
    env.python.conda_dependencies.add_pip_package("scipy")
    spec = Estimator(src, entry_script="train.py", environment_definition=env).to_job_spec()
    assert spec.environment.image == IMAGE and spec.environment.shm_size == "4g"
    assert spec.environment.registry is None
    assert spec.prepare is not None and "scipy" in spec.prepare


def test_base_image_registry_login(src: str) -> None:
    env = Environment("private")
    env.docker.base_image = "train:3"  # named without its registry, as Azure ML allowed
    env.docker.base_image_registry = acr(address="https://myregistry.azurecr.io/")
    spec = Estimator(src, entry_script="train.py", environment_definition=env).to_job_spec()
    assert spec.environment.image == "myregistry.azurecr.io/train:3"
    registry = spec.environment.registry
    assert registry is not None
    assert (registry.server, registry.username, registry.password) == \
        ("myregistry.azurecr.io", "myregistry", "acr-s3cret")
    assert "acr-s3cret" not in repr(spec) and "acr-s3cret" not in str(spec.redacted())
    assert "acr-s3cret" not in repr(env.docker.base_image_registry)


def test_from_docker_image_with_registry_and_pip_requirements(src: str) -> None:
    env = Environment.from_docker_image("e", "myregistry.azurecr.io/train:3",
                                        container_registry=acr(),
                                        pip_requirements=str(Path(src) / "requirements.txt"))
    assert env.python.conda_dependencies.pip_packages == ["numpy"]
    spec = Estimator(src, entry_script="train.py", environment_definition=env).to_job_spec()
    assert spec.environment.image == "myregistry.azurecr.io/train:3"
    assert spec.environment.registry is not None
    assert spec.environment.registry.server == "myregistry.azurecr.io"


def test_estimator_custom_docker_image(src: str) -> None:
    est = PyTorch(src, entry_script="train.py", node_count=2, distributed_backend="mpi",
                  use_gpu=True, custom_docker_image="myregistry.azurecr.io/torch:2",
                  image_registry_details=acr(), shm_size="2g", use_docker=True)
    spec = est.to_job_spec()
    assert spec.environment.image == "myregistry.azurecr.io/torch:2"
    assert spec.environment.shm_size == "2g" and spec.environment.pull_policy == "if_missing"
    assert spec.environment.registry is not None
    assert spec.environment.registry.username == "myregistry"
    assert spec.distribution.type == "mpi" and spec.nodes == 2 and spec.mpi.flavour is None
    dumped = spec.model_dump(mode="json", exclude_none=True)["environment"]
    assert dumped["registry"]["password"] == "acr-s3cret"  # what submit seals


def test_custom_docker_base_image_is_the_older_name(src: str) -> None:
    spec = TensorFlow(src, entry_script="train.py",
                      custom_docker_base_image="tensorflow/tensorflow:1.15.5-gpu").to_job_spec()
    assert spec.environment.image == "tensorflow/tensorflow:1.15.5-gpu"
    with pytest.raises(TrainingException, match="name different images"):
        Estimator(src, entry_script="train.py", custom_docker_image="a:1",
                  custom_docker_base_image="b:1")


def test_no_image_no_container(src: str) -> None:
    """use_docker=True (the default), docker.enabled and shm_size without an image: the ranks
    run on the node, with its own /dev/shm."""
    env = Environment("enabled-only")
    env.docker.enabled = True
    spec = Estimator(src, entry_script="train.py", environment_definition=env,
                     shm_size="8g").to_job_spec()
    assert spec.environment.image is None and spec.environment.shm_size is None


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"custom_docker_image": "x:1", "use_docker": False}, "drop use_docker=False"),
    ({"image_registry_details": acr()}, "a container registry is given but no image"),
    ({"custom_docker_image": "Not An Image"}, "environment.image"),
    ({"custom_docker_image": "x:1", "shm_size": "2 gigs"}, "environment.shm_size"),
])
def test_estimator_container_mistakes(src: str, kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(TrainingException, match=needle):
        Estimator(src, entry_script="train.py", **kwargs).to_job_spec()


def test_estimator_image_and_environment_image_must_agree(src: str) -> None:
    env = Environment.from_docker_image("e", "a:1")
    with pytest.raises(TrainingException, match="differ; give one"):
        Estimator(src, entry_script="train.py", environment_definition=env,
                  custom_docker_image="b:1").to_job_spec()
    spec = Estimator(src, entry_script="train.py", environment_definition=env,
                     custom_docker_image="a:1").to_job_spec()
    assert spec.environment.image == "a:1"


def test_what_needs_a_build_or_runtime_arguments_is_refused(src: str) -> None:
    built = Environment.from_dockerfile("built", "FROM ubuntu\nRUN pip install x\n")
    with pytest.raises(UnsupportedParameterError, match=r"docker\.base_dockerfile") as info:
        Estimator(src, entry_script="train.py", environment_definition=built).to_job_spec()
    assert "nothing builds images here" in str(info.value)
    args = Environment.from_docker_image("args", "ubuntu:22.04")
    args.docker.arguments = ["--ipc=host"]
    with pytest.raises(UnsupportedParameterError, match=r"docker\.arguments"):
        Estimator(src, entry_script="train.py", environment_definition=args).to_job_spec()
    identity = acr()
    identity.registry_identity = object()
    with pytest.raises(UnsupportedParameterError, match="registry_identity"):
        Estimator(src, entry_script="train.py", custom_docker_image="x:1",
                  image_registry_details=identity).to_job_spec()
    conda = Environment.from_docker_image("conda", "ubuntu:22.04")
    conda.python.conda_dependencies.add_conda_package("scipy")
    with pytest.raises(UnsupportedParameterError, match=r"conda_packages \(scipy\)"):
        Estimator(src, entry_script="train.py", environment_definition=conda).to_job_spec()


def test_docker_configuration_shm_size_and_arguments() -> None:
    """What ScriptRunConfig's DockerConfiguration gives, once it is passed on."""
    env = Environment.from_docker_image("e", "ubuntu:22.04")
    env.docker.shm_size = "1g"
    parts = sub.environment_settings(env, "ScriptRunConfig",
                                     docker=DockerConfiguration(True, shm_size="16g"))
    assert parts.environment == {"image": "ubuntu:22.04", "shm_size": "16g"}
    with pytest.raises(UnsupportedParameterError, match=r"DockerConfiguration\.arguments"):
        sub.environment_settings(env, "ScriptRunConfig",
                                 docker=DockerConfiguration(True, arguments=["--privileged"]))


def test_script_run_config_passes_its_image_on(src: str) -> None:
    env = Environment.from_docker_image("img", "me/image:1")
    assert ScriptRunConfig(src, "train.py", environment=env).to_job_spec().environment \
        .image == "me/image:1"
    enabled = Environment("enabled")
    enabled.docker.enabled = True
    assert ScriptRunConfig(src, "train.py", environment=enabled).to_job_spec().environment \
        .image is None
