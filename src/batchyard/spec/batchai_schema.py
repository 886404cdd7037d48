"""The Batch AI 2018-05-01 schema as strict Pydantic models (camelCase on the wire), kept
apart from the reader in batchai.py that turns them into batchyard's JobSpec/ClusterSpec."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from batchyard.spec.job import ENV_ID_RE

_REL_PATH = r"^[^/].*"


class _B(BaseModel):
    # Aliases only: a snake_case key is not Batch AI and must read as an unknown property.
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=False)


class _Python(_B):
    python_script_file_path: str = Field(min_length=1)
    python_interpreter_path: str | None = None
    command_line_args: str | None = None


class _Counted(_Python):
    process_count: int | None = Field(None, ge=1)


class _PyTorch(_Counted):
    communication_backend: str | None = None


class _TensorFlow(_B):
    python_script_file_path: str = Field(min_length=1)
    python_interpreter_path: str | None = None
    master_command_line_args: str | None = None
    worker_command_line_args: str | None = None
    parameter_server_command_line_args: str | None = None
    worker_count: int | None = Field(None, ge=1)
    parameter_server_count: int | None = Field(None, ge=0)


class _Caffe(_B):
    config_file_path: str | None = None
    python_script_file_path: str | None = None
    python_interpreter_path: str | None = None
    command_line_args: str | None = None
    process_count: int | None = Field(None, ge=1)


class _Cntk(_Caffe):
    # Absent in the BrainScript recipes: read from which of the two paths is given.
    language_type: str | None = None


class _CommandLine(_B):
    command_line: str = Field(min_length=1)


class _CustomMpi(_CommandLine):
    process_count: int | None = Field(None, ge=1)


class _Credentials(_B):
    account_key: str | None = None
    account_key_secret_reference: dict[str, Any] | None = None


class _FileShare(_B):
    account_name: str | None = None
    azure_file_url: str = Field(min_length=1)
    credentials: _Credentials | None = None
    relative_mount_path: str = Field(pattern=_REL_PATH)
    file_mode: str | None = None
    directory_mode: str | None = None


class _Blob(_B):
    account_name: str | None = None
    container_name: str = Field(min_length=1)
    credentials: _Credentials | None = None
    relative_mount_path: str = Field(pattern=_REL_PATH)
    mount_options: str | None = None


class _ResourceId(_B):
    id: str = Field(min_length=1)


class _FileServer(_B):
    file_server: _ResourceId
    source_directory: str | None = None
    relative_mount_path: str = Field(pattern=_REL_PATH)
    mount_options: str | None = None


class _Unmanaged(_B):
    mount_command: str = Field(min_length=1)
    relative_mount_path: str = Field(pattern=_REL_PATH)


class _Mounts(_B):
    azure_file_shares: list[_FileShare] = []
    azure_blob_file_systems: list[_Blob] = []
    file_servers: list[_FileServer] = []
    unmanaged_file_systems: list[_Unmanaged] = []


class _NameValue(_B):
    name: str = Field(pattern=ENV_ID_RE)
    value: str | int | float = ""


class _Secret(_B):
    name: str = Field(pattern=ENV_ID_RE)
    value: str | None = None
    key_vault_secret_reference: dict[str, Any] | None = None
    value_secret_reference: dict[str, Any] | None = None


class _Output(_B):
    id: str = Field(pattern=ENV_ID_RE)
    path_prefix: str = Field(min_length=1)
    path_suffix: str | None = None


class _Input(_B):
    id: str = Field(pattern=ENV_ID_RE)
    path: str = Field(min_length=1)


class _Constraints(_B):
    max_wall_clock_time: str | int | None = None


class _KeyVaultReference(_B):
    source_vault: _ResourceId
    secret_url: str = Field(min_length=1)


class _RegistryCredentials(_B):
    """PrivateRegistryCredentials: username is required; one of password and
    passwordSecretReference must be given (checked by the reader, naming both)."""

    username: str = Field(min_length=1)
    password: str | None = None
    password_secret_reference: _KeyVaultReference | None = None


class _ImageSourceRegistry(_B):
    server_url: str | None = None
    image: str = Field(min_length=1)
    credentials: _RegistryCredentials | None = None


class _ContainerSettings(_B):
    image_source_registry: _ImageSourceRegistry
    shm_size: str | None = None


class _Job(_B):
    node_count: int = Field(1, ge=1, le=10000)
    cluster: _ResourceId | None = None
    scheduling_priority: str | None = None
    mount_volumes: _Mounts | None = None
    container_settings: _ContainerSettings | None = None
    py_torch_settings: _PyTorch | None = None
    chainer_settings: _Counted | None = None
    horovod_settings: _Counted | None = None
    custom_mpi_settings: _CustomMpi | None = None
    tensor_flow_settings: _TensorFlow | None = None
    cntk_settings: _Cntk | None = None
    caffe_settings: _Caffe | None = None
    caffe2_settings: _Python | None = None
    custom_toolkit_settings: _CommandLine | None = None
    job_preparation: _CommandLine | None = None
    std_out_err_path_prefix: str | None = None
    input_directories: list[_Input] = []
    output_directories: list[_Output] = []
    environment_variables: list[_NameValue] = []
    secrets: list[_Secret] = []
    constraints: _Constraints | None = None


FRAMEWORKS: tuple[str, ...] = (
    "pyTorchSettings", "chainerSettings", "horovodSettings", "customMpiSettings",
    "tensorFlowSettings", "cntkSettings", "caffeSettings", "caffe2Settings",
    "customToolkitSettings",
)


class _Manual(_B):
    target_node_count: int = Field(ge=0)
    node_deallocation_option: str | None = None


class _AutoScale(_B):
    minimum_node_count: int = Field(0, ge=0)
    maximum_node_count: int = Field(ge=1)
    initial_node_count: int = Field(0, ge=0)


class _Scale(_B):
    manual: _Manual | None = None
    auto_scale: _AutoScale | None = None


class _SetupTask(_CommandLine):
    environment_variables: list[_NameValue] = []
    secrets: list[_Secret] = []
    std_out_err_path_prefix: str | None = None  # setup logs stay in the node's own log dir


class _NodeSetup(_B):
    setup_task: _SetupTask | None = None
    mount_volumes: _Mounts | None = None
    performance_counters_settings: dict[str, Any] | None = None


class _Cluster(_B):
    vm_size: str = Field(min_length=1)
    vm_priority: str | None = None
    scale_settings: _Scale | None = None
    virtual_machine_configuration: dict[str, Any] | None = None
    node_setup: _NodeSetup | None = None
    user_account_settings: dict[str, Any] | None = None  # no ssh here: nothing to honour
    subnet: dict[str, Any] | None = None
