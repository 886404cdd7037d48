"""Azure ML v2 command-job YAML (``az ml job create -f job.yml``) as the native JobSpec
(DESIGN §3.3).

AML substitutes ``${{inputs.x}}`` / ``${{outputs.y}}`` into the command before it runs. Here
data inputs and outputs become references to the environment variables the node launcher
sets (``${BATCHYARD_INPUT_X}``, braced so text right after the reference cannot extend the
name), and literal inputs are substituted as text, as AML does. Input and output ids are
upper-cased in the spec so the variable names match whatever case the job file used.

``environment: {image: ...}`` runs the ranks in that image (with ``resources.shm_size``);
``environment: azureml:NAME:VERSION`` stays a tag and means the frameworks installed here.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batchyard.errors import SpecError, Unsupported
from batchyard.spec.errors import field_path, spec_error_from
from batchyard.spec.job import ENV_ID_RE, JobSpec


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _Resources(_M):
    instance_count: int = Field(1, ge=1, le=10000)
    shm_size: str | None = None
    docker_args: str | list[str] | None = None


class _Environment(_M):
    """An inline environment. AML builds ``conda_file`` and ``build`` into an image; nothing
    builds images here, so both are refused (an image is used as it is)."""

    image: str | None = None
    conda_file: str | dict[str, Any] | None = None
    build: dict[str, Any] | None = None
    os_type: str | None = None
    name: str | None = None
    version: str | int | None = None
    description: str | None = None
    tags: dict[str, Any] = {}


class _Distribution(_M):
    type: str
    process_count_per_instance: int | None = Field(None, ge=1)
    worker_count: int | None = Field(None, ge=1)
    parameter_server_count: int | None = Field(None, ge=0)


class _Limits(_M):
    timeout: int | float | str | None = None


class _Input(_M):
    type: Literal["uri_folder", "uri_file"] = "uri_folder"
    path: str = Field(min_length=1)
    mode: Literal["ro_mount", "download", "direct"] = "ro_mount"
    description: str | None = None


class _Output(_M):
    type: Literal["uri_folder"] = "uri_folder"
    mode: Literal["rw_mount", "upload"] = "rw_mount"
    path: str | None = None
    description: str | None = None


class _Job(_M):
    schema_: str | None = Field(None, alias="$schema")
    type: str = "command"
    name: str | None = None
    display_name: str | None = None
    experiment_name: str | None = None
    description: str | None = None
    tags: dict[str, str | int | float | bool | None] = {}
    command: str = Field(min_length=1)
    code: str | None = None
    environment: str | dict[str, Any] | None = None
    environment_variables: dict[str, str | int | float | bool] = {}
    compute: str | None = None
    resources: _Resources | None = None
    distribution: _Distribution | None = None
    limits: _Limits | None = None
    inputs: dict[str, Any] = {}
    outputs: dict[str, Any] = {}


_NO_BUILDS = ("nothing builds images here: build it yourself, push it, and give it as "
              "environment.image")
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
_REMOTE = re.compile(r"^(azureml:|[a-z][a-z0-9+.-]*://)", re.IGNORECASE)
# Where a native JobSpec field came from, for errors found only after translation.
_NATIVE_TO_AML = {
    "nodes": "resources.instance_count", "env": "environment_variables",
    "limits": "limits.timeout", "experiment": "experiment_name", "cluster": "compute",
    "distribution": "distribution", "command": "command", "code": "code", "tags": "tags",
    "inputs": "inputs", "outputs": "outputs", "description": "description",
}
_ENVIRONMENT_TO_AML = {"image": "environment.image", "shm_size": "resources.shm_size"}


def _fail(source: str, path: str, message: str) -> SpecError:
    return SpecError(f"{source}: {path}: {message}", details=[{"field": path, "message": message}])


def _validate(model: type[_M], data: Any, source: str, prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from(exc, source, prefix=prefix, model=model) from None


def _env_id(key: str, where: str, source: str) -> str:
    if not re.fullmatch(ENV_ID_RE, key):  # fullmatch: "$" alone lets "ID\n" through
        raise _fail(source, f"{where}.{key}", "id must be letters, digits and _ (it names an "
                    "environment variable)")
    return key.upper()


def _inputs(raw: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Data inputs for the spec, and literal inputs as the text they substitute."""
    data: dict[str, Any] = {}
    literals: dict[str, str] = {}
    for key, value in raw.items():
        if isinstance(value, str | int | float | bool):
            literals[key] = str(value)
            continue
        item: _Input = _validate(_Input, value, source, prefix=f"inputs.{key}")
        upper = _env_id(key, "inputs", source)
        if upper in data:
            raise _fail(source, f"inputs.{key}", f"clashes with another input named {upper}")
        data[upper] = {"path": item.path, "mode": item.mode}
    return data, literals


def _outputs(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """Outputs are written to local directories; AML's rw_mount and upload both end up as a
    directory the job writes and batchyard keeps, so the mode needs no datastore here."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        item: _Output = _validate(_Output, value or {}, source, prefix=f"outputs.{key}")
        upper = _env_id(key, "outputs", source)
        if upper in out:
            raise _fail(source, f"outputs.{key}", f"clashes with another output named {upper}")
        if item.path and _REMOTE.match(item.path):
            if not re.match(r"^(azureml://datastores/|datastore://|az://|abfs://|wasbs?://|"
                            r"s3://)", item.path):
                raise Unsupported(
                    f"{source}: outputs.{key}.path: {item.path!r} is not a datastore path; "
                    "give azureml://datastores/NAME/paths/PATH or a local directory",
                    details=[{"field": f"outputs.{key}.path", "message": "unknown storage"}])
            out[upper] = {"path": item.path, "mode": item.mode}
            continue
        out[upper] = {"path_prefix": item.path} if item.path else {}
    return out


def _substitute(command: str, literals: dict[str, str], inputs: set[str], outputs: set[str],
                source: str) -> str:
    def replace(match: re.Match[str]) -> str:
        kind, _, key = match.group(1).partition(".")
        if kind == "inputs" and key in literals:
            return literals[key]
        if kind == "inputs" and key.upper() in inputs:
            return "${BATCHYARD_INPUT_" + key.upper() + "}"
        if kind == "outputs" and key.upper() in outputs:
            return "${BATCHYARD_OUTPUT_" + key.upper() + "}"
        raise _fail(source, "command", f"{match.group(0)} names no input or output of this job")

    return _EXPR.sub(replace, command)


def _distribution(dist: _Distribution, nodes: int, source: str) -> dict[str, Any]:
    kind = dist.type.lower()
    if kind in ("pytorch", "mpi"):
        for name in ("worker_count", "parameter_server_count"):
            if getattr(dist, name) is not None:
                raise _fail(source, f"distribution.{name}", "applies to type tensorflow only")
        return {"type": kind, "processes_per_node": dist.process_count_per_instance or 1}
    if kind != "tensorflow":
        raise _fail(source, "distribution.type", "must be pytorch, mpi or tensorflow")
    if dist.process_count_per_instance is not None:
        raise _fail(source, "distribution.process_count_per_instance",
                    "applies to types pytorch and mpi only")
    workers = dist.worker_count or nodes
    ps = dist.parameter_server_count or 0
    total = workers + ps
    out: dict[str, Any] = {
        "type": "tensorflow", "worker_count": workers, "parameter_server_count": ps,
        "processes_per_node": math.ceil(total / nodes),
    }
    if total % nodes:
        out["process_count"] = total
    return out


def _environment_tag(env: str | dict[str, Any]) -> str:
    if isinstance(env, str):
        return env
    for key in ("name", "image"):
        if env.get(key):
            return str(env[key])
    return "inline"


def _unsupported(source: str, path: str, why: str) -> Unsupported:
    return Unsupported(f"{source}: {path}: {why}", details=[{"field": path, "message": why}])


def _container(job: _Job, source: str) -> dict[str, Any]:
    """The native environment fields of an inline ``environment: {image: ...}`` and
    ``resources.shm_size``. A named environment (``azureml:NAME:VERSION``) stays a tag: it
    means the frameworks installed where batchyard runs, so a size for the /dev/shm of a
    container that does not exist has nothing to apply to."""
    out: dict[str, Any] = {}
    if isinstance(job.environment, dict):
        env: _Environment = _validate(_Environment, job.environment, source,
                                      prefix="environment")
        for key in ("conda_file", "build"):
            if getattr(env, key) is not None:
                raise _unsupported(source, f"environment.{key}", _NO_BUILDS)
        if env.os_type is not None and env.os_type.lower() != "linux":
            raise _unsupported(source, "environment.os_type", "only linux containers run here")
        if env.image is None:
            raise _fail(source, "environment.image", "required for an inline environment "
                        "(or name one: environment: azureml:NAME:VERSION)")
        out["image"] = env.image
    resources = job.resources
    if resources and resources.docker_args:
        raise _unsupported(source, "resources.docker_args", "batchyard starts containers "
                           "itself and passes no extra runtime arguments; use shm_size for "
                           "/dev/shm")
    if resources and resources.shm_size is not None and out:
        out["shm_size"] = resources.shm_size
    return out


def _compute(value: str) -> str:
    """``azureml:cpu-cluster`` or a full ARM id ``azureml:/subscriptions/.../computes/x``."""
    return value.removeprefix("azureml:").rstrip("/").rsplit("/", 1)[-1]


def read_aml_job(data: dict[str, Any], *, source: str = "job.yml") -> JobSpec:
    """An AML v2 command job as the native JobSpec; AML-only settings are kept in tags."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at the top level")
    job: _Job = _validate(_Job, data, source)
    if job.type != "command":
        raise Unsupported(
            f"{source}: type: only command jobs are supported, not {job.type!r}",
            details=[{"field": "type", "message": "only command jobs are supported"}],
        )
    nodes = job.resources.instance_count if job.resources else 1
    inputs, literals = _inputs(job.inputs, source)
    outputs = _outputs(job.outputs, source)
    tags = {k: "" if v is None else str(v) for k, v in job.tags.items()}
    if job.environment is not None:
        tags["aml_environment"] = _environment_tag(job.environment)
    container = _container(job, source)
    spec: dict[str, Any] = {
        "nodes": nodes,
        "command": _substitute(job.command, literals, set(inputs), set(outputs), source),
        "inputs": inputs, "outputs": outputs, "tags": tags,
        "env": dict(job.environment_variables),
    }
    name_key = "name" if job.name else "display_name"
    optional = {
        "name": job.name or job.display_name, "experiment": job.experiment_name,
        "description": job.description, "code": job.code,
        "cluster": _compute(job.compute) if job.compute else None,
        "distribution": _distribution(job.distribution, nodes, source)
        if job.distribution else None,
        "limits": {"max_wall_clock": job.limits.timeout}
        if job.limits and job.limits.timeout is not None else None,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    if container:
        spec["environment"] = container
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            loc = err["loc"]
            head = str(loc[0]) if loc else ""
            where = name_key if head == "name" else _NATIVE_TO_AML.get(head, "(top level)")
            if head == "environment" and len(loc) > 1:
                where = _ENVIRONMENT_TO_AML.get(str(loc[1]), "environment")
            msg = str(err["msg"]).removeprefix("Value error, ")
            problems.append({"field": where, "message": f"{msg} ({field_path(loc)})"})
        text = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        raise SpecError(f"{source}: {text}", details=problems) from None
