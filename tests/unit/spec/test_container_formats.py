"""Container images in every job format: the native ``environment`` block (image, registry,
pull_policy, shm_size) and ``mpi.flavour``; Batch AI ``containerSettings`` (no --ignore
needed any more, Key Vault passwords taken from the job's secrets); Azure ML v2 inline
environments and ``resources.shm_size``. Every refusal names the field the user wrote."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from batchyard.errors import SpecError, Unsupported
from batchyard.spec.amlv2 import read_aml_job
from batchyard.spec.batchai import read_batchai_job
from batchyard.spec.containers import registry_host, same_registry, shm_bytes
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import JobSpec, json_schema

DIGEST = "sha256:" + "ab" * 32


def native(**environment: Any) -> JobSpec:
    return JobSpec.model_validate({"command": "true", "environment": environment})


def native_error(spec: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({"command": "true", **spec})
    return spec_error_from(info.value, "job.yaml").message


# --- the native spec ---------------------------------------------------------------------

@pytest.mark.parametrize("image", [
    "ubuntu", "ubuntu:22.04", "library/ubuntu:22.04", "nvcr.io/nvidia/pytorch:24.01-py3",
    "127.0.0.1:5000/team/train:v1", "localhost:5000/x", "localhost/x", "[::1]:5000/x:1",
    f"pytorch/pytorch@{DIGEST}", f"ghcr.io/o/r:t@{DIGEST}", "a__b/c-d.e_f:T_a.g-1",
    "myregistry.azurecr.io/deep/path/image:latest", "batchaitraining/chainermn:IntelMPI",
    "MyRegistry.AzureCR.io/image",  # the host part may have capitals, the name not
])
def test_image_references_accepted(image: str) -> None:
    assert native(image=image).environment.image == image


@pytest.mark.parametrize("image", [
    "", "Ubuntu", "ubuntu latest", "-v /:/host", "--privileged", "ubuntu:", ":22.04",
    "ubuntu:22.04:1", "x/../y", "/ubuntu", "ubuntu/", "ubuntu@sha256:abc", "a" * 600,
    "ubuntu\n", "ubuntu:" + "t" * 129, "ubuntu\x00",
])
def test_bad_image_references_refused_naming_the_field(image: str) -> None:
    message = native_error({"environment": {"image": image}})
    assert message.startswith("job.yaml: environment.image: "), message


def test_bad_image_message_says_what_a_reference_is() -> None:
    message = native_error({"environment": {"image": "My Image"}})
    assert "'My Image' is not a container image reference" in message
    assert "[registry[:port]/]name[:tag][@digest]" in message
    assert "at most 512 characters" in native_error({"environment": {"image": "a" * 600}})


def test_no_image_is_no_container_and_defaults_round_trip() -> None:
    spec = JobSpec.model_validate({"command": "true"})
    assert spec.environment.image is None and spec.environment.registry is None
    assert spec.environment.pull_policy == "if_missing" and spec.mpi.flavour is None
    stored = spec.model_dump(mode="json", exclude_none=True)  # what submit stores
    assert JobSpec.model_validate(stored) == spec


def test_full_container_environment_round_trips() -> None:
    data = {"command": "true", "secrets": {"ACR": "pw"}, "mpi": {"flavour": "mpich"},
            "environment": {"image": "myregistry.azurecr.io/train:1", "pull_policy": "always",
                            "shm_size": "16g", "registry": {
                                "server": "myregistry.azurecr.io", "username": "me",
                                "password_secret": "ACR"}}}
    spec = JobSpec.model_validate(data)
    assert spec.environment.registry is not None
    assert spec.environment.registry.password_secret == "ACR"
    stored = spec.model_dump(mode="json", exclude_none=True)
    assert JobSpec.model_validate(stored) == spec


@pytest.mark.parametrize("policy", ["always", "if_missing", "never"])
def test_pull_policies(policy: str) -> None:
    assert native(image="x", pull_policy=policy).environment.pull_policy == policy


def test_bad_pull_policy_named() -> None:
    message = native_error({"environment": {"image": "x", "pull_policy": "sometimes"}})
    assert "environment.pull_policy" in message and "'always'" in message


@pytest.mark.parametrize(("size", "size_bytes"), [
    ("8g", 8 * 2**30), ("8G", 8 * 2**30), ("512m", 512 * 2**20), ("64k", 65536), ("2b", 2),
    ("1073741824", 2**30),
])
def test_shm_sizes(size: str, size_bytes: int) -> None:
    assert native(image="x", shm_size=size).environment.shm_size == size
    assert shm_bytes(size) == size_bytes


@pytest.mark.parametrize("size", ["0", "0g", "8gb", "8 g", "-1g", "1.5g", "g", "", "8t",
                                  "99999999999999999999g", "9223372036854775808"])
def test_bad_shm_sizes_named(size: str) -> None:
    message = native_error({"environment": {"image": "x", "shm_size": size}})
    assert message.startswith("job.yaml: environment.shm_size: "), message
    assert "is not a size" in message


def test_container_settings_without_an_image_refused() -> None:
    message = native_error({"environment": {"registry": {"server": "r.io"}}})
    assert message == ("job.yaml: environment: registry applies to a container image: set "
                       "image too")
    message = native_error({"environment": {"shm_size": "8g"}})
    assert message.startswith("job.yaml: environment: shm_size applies to container jobs")


@pytest.mark.parametrize(("registry", "needle"), [
    ({"username": "u", "password": "p", "password_secret": "S"},
     "give password or password_secret, not both"),
    ({"username": "u"}, "username needs a password or a password_secret"),
    ({"password": "p"}, "a password needs a username"),
    ({"password_secret": "S"}, "a password needs a username"),
])
def test_registry_login_must_be_whole(registry: dict[str, str], needle: str) -> None:
    message = native_error({"secrets": {"S": "x"},
                            "environment": {"image": "x", "registry": registry}})
    assert message == f"job.yaml: environment.registry: {needle}"


def test_password_secret_must_name_a_job_secret() -> None:
    message = native_error({"secrets": {"OTHER": "x"}, "environment": {
        "image": "x", "registry": {"username": "u", "password_secret": "ACR_PASSWORD"}}})
    assert message == ("job.yaml: environment.registry.password_secret: 'ACR_PASSWORD' is not "
                       "one of the job's secrets; add it under secrets")
    message = native_error({"environment": {
        "image": "x", "registry": {"username": "u", "password_secret": "acr-password"}}})
    assert message.startswith("job.yaml: environment.registry.password_secret: String should "
                              "match pattern")


@pytest.mark.parametrize("server", ["https://r.azurecr.io", "r.azurecr.io/v2", "r io", "",
                                    "r.io:99999999", "-r.io"])
def test_bad_registry_servers_named(server: str) -> None:
    message = native_error({"environment": {"image": "x", "registry": {"server": server}}})
    assert message.startswith("job.yaml: environment.registry.server: "), message


def test_server_must_be_the_images_registry() -> None:
    message = native_error({"environment": {"image": "nvcr.io/nvidia/pytorch:24.01-py3",
                                            "registry": {"server": "r.azurecr.io"}}})
    assert message == ("job.yaml: environment: registry.server 'r.azurecr.io' is not the "
                       "registry of image 'nvcr.io/nvidia/pytorch:24.01-py3': name the "
                       "registry in the image ('r.azurecr.io/nvidia/pytorch:24.01-py3') or "
                       "leave server out")
    assert native(image="127.0.0.1:5000/x", registry={"server": "127.0.0.1:5000"})
    assert native(image="tensorflow/tensorflow", registry={"server": "index.docker.io"})
    assert same_registry("ubuntu", "docker.io") and not same_registry("ubuntu", "r.io")


def test_registry_password_is_never_shown() -> None:
    spec = native(image="x", registry={"username": "u", "password": "s3cr3t-pw"})
    assert "s3cr3t" not in repr(spec) and "s3cr3t" not in str(spec)
    assert spec.redacted()["environment"]["registry"] == {"username": "u", "password": "***"}
    assert spec.model_dump()["environment"]["registry"]["password"] == "s3cr3t-pw"  # stored


@pytest.mark.parametrize(("given", "flavour"), [
    ({}, None), ({"flavour": "openmpi"}, "openmpi"), ({"flavour": "mpich"}, "mpich"),
    ({"flavour": "IntelMPI"}, "intelmpi"), ({"flavor": "openmpi"}, "openmpi"),
    ({"flavour": None}, None),
])
def test_mpi_flavours(given: dict[str, Any], flavour: str | None) -> None:
    spec = JobSpec.model_validate({"command": "true", "mpi": given,
                                   "distribution": {"type": "mpi"}})
    assert spec.mpi.flavour == flavour


def test_bad_mpi_flavour_named() -> None:
    message = native_error({"mpi": {"flavour": "lam"}})
    assert message.startswith("job.yaml: mpi.flavour: "), message
    assert "'openmpi', 'mpich' or 'intelmpi'" in message
    assert "unknown field" in native_error({"mpi": {"kind": "openmpi"}})


def test_json_schema_describes_the_new_fields() -> None:
    defs = json_schema()["$defs"]
    assert {"image", "registry", "pull_policy", "shm_size", "python"} <= \
        set(defs["Environment"]["properties"])
    assert set(defs["RegistrySpec"]["properties"]) == \
        {"server", "username", "password", "password_secret"}
    assert "flavour" in defs["MpiSettings"]["properties"]
    assert "mpi" in json_schema()["properties"]


# --- Batch AI job.json -------------------------------------------------------------------

def batchai(container: dict[str, Any], **props: Any) -> dict[str, Any]:
    return {"properties": {"nodeCount": 2, "horovodSettings": {
        "pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPTS/train.py"},
        "containerSettings": container, **props}}


def batchai_error(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as info:
        read_batchai_job(data)
    assert not isinstance(info.value, Unsupported)  # a fix in the file, not --ignore
    return info.value


# (framework block, its settings, the image) of every Batch AI recipe job.json
# (github.com/Azure/BatchAI recipes/*/job.json), re-expressed: each runs in its image now.
RECIPES: list[tuple[str, dict[str, Any], str]] = [
    ("customMpiSettings", {"commandLine": "python $AZ_BATCHAI_INPUT_SCRIPT/score.py"},
     "tensorflow/tensorflow:1.7.0-gpu"),
    ("cntkSettings", {"configFilePath": "$AZ_BATCHAI_INPUT_CONFIG/ConvNet_MNIST.cntk",
                      "commandLineArgs": "rootDir=. outputDir=$AZ_BATCHAI_OUTPUT_MODEL"},
     "microsoft/cntk:2.1-gpu-python3.5-cuda8.0-cudnn6.0"),
    ("cntkSettings", {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPT/ConvNet.py",
                      "processCount": 8},
     "batchaitraining/cntk:2.3-gpu-1bitsgd-py36-cuda8-cudnn6-intelmpi"),
    ("cntkSettings", {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPT/ConvNet_MNIST.py"},
     "microsoft/cntk:2.5.1-gpu-python2.7-cuda9.0-cudnn7.0"),
    ("caffe2Settings", {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPT/resnet50.py"},
     "caffe2ai/caffe2"),
    ("chainerSettings", {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPT/train_mnist.py"},
     "batchaitraining/chainermn:IntelMPI"),
    ("chainerSettings", {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPT/train_mnist.py"},
     "batchaitraining/chainermn:openMPI"),
    ("horovodSettings", {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPTS/tf_cnn.py"},
     "tensorflow/tensorflow:1.8.0-gpu"),
    ("horovodSettings", {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPTS/mnist.py"},
     "batchaitraining/pytorch:0.4.0-cp36-cuda9-cudnn7"),
    ("pyTorchSettings", {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPTS/mnist.py",
                         "communicationBackend": "gloo"}, "pytorch/pytorch:0.4_cuda9_cudnn7"),
    ("tensorFlowSettings", {"pythonScriptFilePath": "$AZ_BATCHAI_INPUT_SCRIPTS/mnist.py",
                            "masterCommandLineArgs": "--job_name=worker",
                            "workerCommandLineArgs": "--job_name=worker",
                            "parameterServerCommandLineArgs": "--job_name=ps"},
     "tensorflow/tensorflow:1.8.0-gpu"),
]


@pytest.mark.parametrize(("block", "settings", "image"), RECIPES,
                         ids=[f"{b}-{i}" for b, _s, i in RECIPES])
def test_every_batchai_recipe_runs_in_its_image(block: str, settings: dict[str, Any],
                                               image: str) -> None:
    spec = read_batchai_job({"$schema": "https://raw.githubusercontent.com/Azure/BatchAI/"
                                        "master/schemas/2018-05-01/job.json",
                             "properties": {"nodeCount": 2, block: settings,
                                            "containerSettings": {
                                                "imageSourceRegistry": {"image": image}}}})
    assert spec.environment.image == image
    assert spec.environment.registry is None and spec.environment.shm_size is None


def test_cntk_brainscript_recipe_without_language_type() -> None:
    """The BrainScript recipes give configFilePath and no languageType: BrainScript it is."""
    spec = read_batchai_job({"properties": {
        "nodeCount": 1, "containerSettings": {"imageSourceRegistry": {"image": "microsoft/cntk"}},
        "cntkSettings": {"configFilePath": "$AZ_BATCHAI_INPUT_C/conv.cntk",
                         "commandLineArgs": "rootDir=."}}})
    assert spec.command == "cntk configFile=$AZ_BATCHAI_INPUT_C/conv.cntk rootDir=."


def test_private_registry_with_password() -> None:
    """The ACR recipe of the Batch AI docs: serverUrl, a qualified image, username/password."""
    spec = read_batchai_job(batchai({"imageSourceRegistry": {
        "serverUrl": "demo.azurecr.io", "image": "demo.azurecr.io/myimage:1",
        "credentials": {"username": "demo", "password": "acr-pw"}}, "shmSize": "8g"}))
    env = spec.environment
    assert env.image == "demo.azurecr.io/myimage:1" and env.shm_size == "8g"
    assert env.registry is not None and env.pull_policy == "if_missing"
    assert (env.registry.server, env.registry.username, env.registry.password) == \
        ("demo.azurecr.io", "demo", "acr-pw")
    assert "acr-pw" not in str(spec.redacted()) and "acr-pw" not in repr(spec)


def test_nvidia_registry_recipe() -> None:
    spec = read_batchai_job(batchai({"imageSourceRegistry": {
        "image": "nvcr.io/nvidia/tensorflow:17.10", "serverUrl": "nvcr.io",
        "credentials": {"username": "$oauthtoken", "password": "<Your API Key>"}}}))
    assert spec.environment.registry is not None
    assert spec.environment.registry.username == "$oauthtoken"
    assert spec.environment.registry.server == "nvcr.io"


@pytest.mark.parametrize(("server_url", "image", "server", "wanted"), [
    ("https://demo.azurecr.io/", "myimage:1", "demo.azurecr.io", "demo.azurecr.io/myimage:1"),
    ("demo.azurecr.io", "team/myimage", "demo.azurecr.io", "demo.azurecr.io/team/myimage"),
    ("https://index.docker.io/v1/", "me/private:2", None, "me/private:2"),
    ("127.0.0.1:5000", "127.0.0.1:5000/x", "127.0.0.1:5000", "127.0.0.1:5000/x"),
])
def test_server_url_becomes_the_registry_host(server_url: str, image: str,
                                              server: str | None, wanted: str) -> None:
    spec = read_batchai_job(batchai({"imageSourceRegistry": {
        "serverUrl": server_url, "image": image,
        "credentials": {"username": "u", "password": "p"}}}))
    assert spec.environment.image == wanted
    assert spec.environment.registry is not None
    assert spec.environment.registry.server == server
    assert registry_host(server_url) == server


def test_key_vault_password_taken_from_the_jobs_secrets() -> None:
    ref = {"sourceVault": {"id": "/subscriptions/s/resourceGroups/g/providers/"
                                 "Microsoft.KeyVault/vaults/myvault"},
           "secretUrl": "https://myvault.vault.azure.net/secrets/acr-password/0123abcd"}
    container = {"imageSourceRegistry": {"serverUrl": "demo.azurecr.io",
                                         "image": "demo.azurecr.io/myimage",
                                         "credentials": {"username": "demo",
                                                         "passwordSecretReference": ref}}}
    spec = read_batchai_job(batchai(container, secrets=[
        {"name": "acr_password", "value": "from-the-job"}]))
    assert spec.environment.registry is not None
    assert spec.environment.registry.password_secret == "acr_password"
    assert spec.environment.registry.password is None
    assert spec.secrets == {"acr_password": "from-the-job"}

    error = batchai_error(batchai(container))
    assert error.message == (
        "job.json: containerSettings.imageSourceRegistry.credentials.passwordSecretReference: "
        "Azure Key Vault is not reachable here: add the registry password to the job's "
        'secrets as {"name": "acr_password", "value": "..."} (the Key Vault name '
        "'acr-password' with - as _), or give credentials.password")
    assert error.details == [{"field": "containerSettings.imageSourceRegistry.credentials."
                                       "passwordSecretReference", "message": error.details[0][
                                           "message"]}]


def test_key_vault_names_that_cannot_be_secret_names() -> None:
    ref = {"sourceVault": {"id": "/subscriptions/s"},
           "secretUrl": "https://v.vault.azure.net/secrets/1password"}
    error = batchai_error(batchai({"imageSourceRegistry": {"image": "x", "credentials": {
        "username": "u", "passwordSecretReference": ref}}}))
    assert "'1password' cannot name one of the job's secrets" in error.message
    ref["secretUrl"] = "https://v.vault.azure.net/keys/k"
    error = batchai_error(batchai({"imageSourceRegistry": {"image": "x", "credentials": {
        "username": "u", "passwordSecretReference": ref}}}))
    assert error.message.startswith("job.json: containerSettings.imageSourceRegistry."
                                    "credentials.passwordSecretReference.secretUrl: not a Key "
                                    "Vault secret URL")


@pytest.mark.parametrize("credentials", [
    {"username": "u"},
    {"username": "u", "password": "p", "passwordSecretReference": {
        "sourceVault": {"id": "/x"}, "secretUrl": "https://v.vault.azure.net/secrets/p"}},
])
def test_exactly_one_password_source(credentials: dict[str, Any]) -> None:
    error = batchai_error(batchai({"imageSourceRegistry": {"image": "x",
                                                           "credentials": credentials}}))
    assert error.message == ("job.json: containerSettings.imageSourceRegistry.credentials: "
                             "give exactly one of password and passwordSecretReference")


@pytest.mark.parametrize(("container", "field"), [
    ({}, "containerSettings.imageSourceRegistry"),
    ({"imageSourceRegistry": {}}, "containerSettings.imageSourceRegistry.image"),
    ({"imageSourceRegistry": {"image": "x", "imageName": "y"}},
     "containerSettings.imageSourceRegistry.imageName"),
    ({"imageSourceRegistry": {"image": "x", "credentials": {"password": "p"}}},
     "containerSettings.imageSourceRegistry.credentials.username"),
    ({"imageSourceRegistry": {"image": "x"}, "shm_size": "8g"}, "containerSettings.shm_size"),
])
def test_schema_errors_name_the_batchai_path(container: dict[str, Any], field: str) -> None:
    error = batchai_error(batchai(container))
    assert error.message.startswith(f"job.json: {field}: "), error.message


@pytest.mark.parametrize(("container", "field"), [
    ({"imageSourceRegistry": {"image": "Not An Image"}},
     "containerSettings.imageSourceRegistry.image"),
    ({"imageSourceRegistry": {"image": "x"}, "shmSize": "8 GB"}, "containerSettings.shmSize"),
    ({"imageSourceRegistry": {"image": "x", "serverUrl": "https://bad host/"}},
     "containerSettings.imageSourceRegistry.serverUrl"),
])
def test_value_errors_name_the_batchai_property(container: dict[str, Any], field: str) -> None:
    error = batchai_error(batchai(container))
    assert error.message.startswith(f"job.json: {field}: "), error.message
    assert error.details and error.details[0]["field"] == field


def test_container_settings_need_no_ignore_and_keep_the_interpreter() -> None:
    data = batchai({"imageSourceRegistry": {"image": "pytorch/pytorch:0.4_cuda9_cudnn7"}})
    data["properties"]["horovodSettings"]["pythonInterpreterPath"] = "/opt/conda/bin/python"
    plain = read_batchai_job(copy.deepcopy(data))
    ignored = read_batchai_job(copy.deepcopy(data), ignore={"containerSettings"})
    assert plain == ignored  # --ignore only ever drops what is refused
    assert plain.environment.python == "/opt/conda/bin/python"
    assert plain.environment.image == "pytorch/pytorch:0.4_cuda9_cudnn7"


# --- Azure ML v2 command jobs ------------------------------------------------------------

def aml(**fields: Any) -> dict[str, Any]:
    return {"$schema": "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json",
            "command": "python train.py", **fields}


def test_aml_inline_image() -> None:
    spec = read_aml_job(aml(environment={
        "image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04:latest"},
        resources={"instance_count": 2, "shm_size": "16g"}, distribution={"type": "mpi"}))
    assert spec.environment.image == "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04:latest"
    assert spec.environment.shm_size == "16g" and spec.nodes == 2
    assert spec.tags["aml_environment"] == spec.environment.image


def test_aml_named_environment_stays_a_tag() -> None:
    spec = read_aml_job(aml(environment="azureml:AzureML-pytorch-1.13-cuda11.7:3",
                            resources={"shm_size": "8g"}))
    assert spec.environment.image is None and spec.environment.shm_size is None
    assert spec.tags["aml_environment"] == "azureml:AzureML-pytorch-1.13-cuda11.7:3"


@pytest.mark.parametrize(("environment", "field"), [
    ({"image": "x", "conda_file": "conda.yml"}, "environment.conda_file"),
    ({"image": "x", "conda_file": {"dependencies": ["python=3.10"]}}, "environment.conda_file"),
    ({"build": {"path": "docker-context"}}, "environment.build"),
    ({"image": "x", "os_type": "windows"}, "environment.os_type"),
])
def test_aml_environments_that_need_a_build_refused(environment: dict[str, Any],
                                                     field: str) -> None:
    with pytest.raises(Unsupported) as info:
        read_aml_job(aml(environment=environment))
    assert info.value.message.startswith(f"job.yml: {field}: "), info.value.message
    assert info.value.details == [{"field": field, "message": info.value.details[0]["message"]}]


def test_aml_docker_args_refused() -> None:
    with pytest.raises(Unsupported, match=r"^job\.yml: resources\.docker_args: "):
        read_aml_job(aml(environment={"image": "x"}, resources={"docker_args": "--ipc=host"}))


@pytest.mark.parametrize(("fields", "needle"), [
    ({"environment": {"conda": "x"}}, "job.yml: environment.conda: unknown field"),
    ({"environment": {"description": "no image"}}, "job.yml: environment.image: required"),
    ({"environment": {"image": "Bad Image"}}, "job.yml: environment.image: 'Bad Image' is not"),
    ({"environment": {"image": "x"}, "resources": {"shm_size": "lots"}},
     "job.yml: resources.shm_size: 'lots' is not a size"),
])
def test_aml_environment_errors_named(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as info:
        read_aml_job(aml(**fields))
    assert info.value.message.startswith(needle), info.value.message
