"""Azure Batch AI ``job.json`` / ``cluster.json`` (API 2018-05-01), read verbatim (DESIGN §3.2).

Batch AI validated strictly, so this reader does too: an unknown property is an error, and
every message names the property path as the user wrote it (camelCase, ``properties.``
omitted). What cannot run here is refused with :class:`Unsupported` rather than dropped; the
user may drop it knowingly with ``--ignore <path>`` (an ancestor path drops everything under
it). ``--ignore`` only ever drops what would otherwise be refused.

``$AZ_BATCHAI_*`` references stay unexpanded in commands and paths: the node launcher runs
commands through a shell that has them set, exactly as Batch AI did. ``containerSettings``
runs the ranks in its image (mapped in spec.containers).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Set as AbstractSet
from typing import Any

from pydantic import ValidationError

from batchyard.errors import SpecError, Unsupported
from batchyard.spec.batchai_schema import (
    _B,
    FRAMEWORKS,
    _Caffe,
    _Cluster,
    _Cntk,
    _Credentials,
    _Job,
    _Mounts,
    _TensorFlow,
)
from batchyard.spec.cluster import ClusterSpec
from batchyard.spec.containers import batchai_environment
from batchyard.spec.durations import parse_duration
from batchyard.spec.errors import field_path, spec_error_from
from batchyard.spec.job import JobSpec
from batchyard.spec.sizes import lookup
from batchyard.suggest import did_you_mean

# Mount kinds the node launcher can reach: Azure Blob containers are staged through the
# storage layer, Azure file shares through the datastore the user maps to the share URL.
REACHABLE_MOUNT_KINDS: frozenset[str] = frozenset(
    {"local", "file_server", "unmanaged", "azure_blob", "azure_files"})
_ISO = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")
_BACKENDS = {"gloo": "gloo", "nccl": "nccl", "mpi": "mpi", "tcp": "gloo"}
# Where a native JobSpec field came from, for errors found only after translation.
_NATIVE_TO_BATCHAI = {
    "nodes": "nodeCount", "prepare": "jobPreparation.commandLine", "env": "environmentVariables",
    "secrets": "secrets", "inputs": "inputDirectories", "outputs": "outputDirectories",
    "mounts": "mountVolumes", "limits": "constraints.maxWallClockTime",
    "priority": "schedulingPriority", "stdouterr_path_prefix": "stdOutErrPathPrefix",
    "cluster": "cluster.id",
}
_ENVIRONMENT_TO_BATCHAI = {"image": "containerSettings.imageSourceRegistry.image",
                           "registry": "containerSettings.imageSourceRegistry",
                           "shm_size": "containerSettings.shmSize"}


def _fail(source: str, path: str, message: str) -> SpecError:
    return SpecError(f"{source}: {path}: {message}", details=[{"field": path, "message": message}])


def _ignored(path: str, ignore: AbstractSet[str]) -> bool:
    wanted = {item.removeprefix("properties.") for item in ignore}
    while path:
        if path in wanted:
            return True
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return False


def _refuse(source: str, path: str, why: str, ignore: AbstractSet[str]) -> None:
    """Raise Unsupported for ``path`` unless the user chose to drop it (then just return)."""
    if _ignored(path, ignore):
        return
    raise Unsupported(
        f"{source}: {path}: {why}; pass --ignore {path} to run the rest",
        details=[{"field": path, "message": why}],
    )


def _unwrap(data: Any, source: str) -> dict[str, Any]:
    """The properties object, whether wrapped in ``{"properties": ...}`` or given bare."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a JSON object at the top level")
    if "properties" not in data:
        return {k: v for k, v in data.items() if k != "$schema"}
    extra = sorted(set(data) - {"$schema", "properties"})
    if extra:
        raise _fail(source, ", ".join(extra), "unknown field (next to properties)"
                    + did_you_mean(extra[0], ("$schema", "properties")))
    if not isinstance(data["properties"], dict):
        raise _fail(source, "properties", "must be a JSON object")
    return data["properties"]


def _validate(model: type[_B], props: dict[str, Any], source: str) -> Any:
    try:
        return model.model_validate(props)
    except ValidationError as exc:
        raise spec_error_from(exc, source, model=model) from None


def _word(text: str) -> str:
    # A path holding $VARS must stay unquoted so the node's shell can expand it.
    return text if "$" in text else shlex.quote(text)


def _python(script: str, interpreter: str | None, args: str | None) -> str:
    parts = [_word(interpreter) if interpreter else "python", _word(script)]
    if args and args.strip():
        parts.append(args.strip())
    return " ".join(parts)


def _mpi(count: int | None, nodes: int, command: str) -> dict[str, Any]:
    total = count or nodes
    dist = {"type": "mpi", "process_count": total, "processes_per_node": math.ceil(total / nodes)}
    return {"distribution": dist, "command": command}


def _framework(job: _Job, source: str) -> dict[str, Any]:
    """The distribution and command(s) of the single framework block."""
    present = [k for k in FRAMEWORKS if getattr(job, _snake(k)) is not None]
    if len(present) != 1:
        found = ", ".join(present) if present else "none"
        raise _fail(source, " / ".join(present) or "(framework)",
                    f"exactly one framework block is required (one of {', '.join(FRAMEWORKS)}); "
                    f"found: {found}")
    key, nodes = present[0], job.node_count
    block = getattr(job, _snake(key))
    python = getattr(block, "python_interpreter_path", None)
    out: dict[str, Any] = {"environment": {"python": python}} if python else {}
    if key == "pyTorchSettings":
        count = block.process_count or nodes
        if count % nodes:
            raise _fail(source, f"{key}.processCount",
                        f"{count} processes cannot be spread evenly over nodeCount {nodes}")
        backend = "auto"
        if block.communication_backend:
            backend = _BACKENDS.get(block.communication_backend.lower(), "")
            if not backend:
                raise _fail(source, f"{key}.communicationBackend",
                            "must be one of TCP, Gloo, NCCL, MPI")
        out["distribution"] = {
            "type": "pytorch", "processes_per_node": count // nodes, "backend": backend,
        }
        out["command"] = _python(block.python_script_file_path, python, block.command_line_args)
    elif key in ("chainerSettings", "horovodSettings", "caffe2Settings"):
        command = _python(block.python_script_file_path, python, block.command_line_args)
        out |= _mpi(getattr(block, "process_count", None), nodes, command)
    elif key == "customMpiSettings":
        out |= _mpi(block.process_count, nodes, block.command_line)
    elif key == "customToolkitSettings":
        out |= {"distribution": {"type": "custom"}, "command": block.command_line}
    elif key == "tensorFlowSettings":
        out |= _tensorflow(block, nodes)
    else:
        out |= _mpi(block.process_count, nodes, _config_or_script(key, block, source))
    return out


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def _config_or_script(key: str, block: _Caffe, source: str) -> str:
    """CNTK and Caffe run either a config file (BrainScript / solver) or a Python script."""
    args = block.command_line_args
    if isinstance(block, _Cntk):
        config_only = block.config_file_path and not block.python_script_file_path
        language = (block.language_type or ("BrainScript" if config_only else "Python")).lower()
        if language not in ("python", "brainscript"):
            raise _fail(source, f"{key}.languageType", "must be Python or BrainScript")
        brain = language == "brainscript"
        path = block.config_file_path if brain else block.python_script_file_path
        if not path:
            wanted = "configFilePath" if brain else "pythonScriptFilePath"
            raise _fail(source, f"{key}.{wanted}",
                        f"required for languageType {block.language_type or 'Python'}")
        if language == "python":
            return _python(path, block.python_interpreter_path, args)
        return " ".join(p for p in ("cntk", f"configFile={_word(path)}", args) if p)
    if bool(block.config_file_path) == bool(block.python_script_file_path):
        raise _fail(source, f"{key}.configFilePath",
                    "give exactly one of configFilePath and pythonScriptFilePath")
    if block.python_script_file_path:
        return _python(block.python_script_file_path, block.python_interpreter_path, args)
    solver = _word(block.config_file_path or "")
    return " ".join(p for p in ("caffe train", f"--solver={solver}", args) if p)


def _tensorflow(block: _TensorFlow, nodes: int) -> dict[str, Any]:
    """Batch AI's master becomes TF's chief; it is one of the workers (task 0), as in the
    Batch AI recipes. Workers default to nodeCount and parameter servers to 1 when the job is
    distributed; a count that does not fill every node evenly becomes ``process_count``."""
    script, python = block.python_script_file_path, block.python_interpreter_path
    master = _python(script, python, block.master_command_line_args)
    distributed = any(
        x is not None
        for x in (block.worker_command_line_args, block.parameter_server_command_line_args,
                  block.worker_count, block.parameter_server_count)
    )
    if not distributed:
        dist: dict[str, Any] = {"type": "tensorflow", "role_commands": {"chief": master}}
        return {"distribution": dist, "command": master}
    workers = block.worker_count or nodes
    ps = 1 if block.parameter_server_count is None else block.parameter_server_count
    roles = {"chief": master, "worker": _python(script, python, block.worker_command_line_args)}
    if ps:
        roles["ps"] = _python(script, python, block.parameter_server_command_line_args)
    total = workers + ps
    dist = {
        "type": "tensorflow", "worker_count": workers, "parameter_server_count": ps,
        "processes_per_node": math.ceil(total / nodes), "role_commands": roles,
    }
    if total % nodes:
        dist["process_count"] = total
    return {"distribution": dist, "command": master}


def _local_source(value: str | None) -> str | None:
    """The directory a ``file://`` URL or absolute path names; None for real storage."""
    if not value:
        return None
    if value.startswith("file://"):
        rest = value[len("file://"):]
        return rest[len("localhost"):] if rest.startswith("localhost/") else rest
    return value if value.startswith("/") else None


def _mounts(mv: _Mounts, source: str, ignore: AbstractSet[str],
            prefix: str = "mountVolumes") -> list[dict[str, Any]]:
    found: list[tuple[str, dict[str, Any], _Credentials | None]] = []
    for i, share in enumerate(mv.azure_file_shares):
        path, local = f"{prefix}.azureFileShares[{i}]", _local_source(share.azure_file_url)
        modes = [f"{k}={v}" for k, v in (("file_mode", share.file_mode),
                                          ("dir_mode", share.directory_mode)) if v]
        found.append((path, {
            "kind": "local" if local else "azure_files", "source": local or share.azure_file_url,
            "relative_path": share.relative_mount_path, "account_name": share.account_name,
            "mount_options": ",".join(modes) or None,
        }, share.credentials))
    for i, blob in enumerate(mv.azure_blob_file_systems):
        path = f"{prefix}.azureBlobFileSystems[{i}]"
        local = _local_source(blob.container_name)
        base = _local_source(blob.account_name)
        if not local and base:
            local = f"{base.rstrip('/')}/{blob.container_name}"
        found.append((path, {
            "kind": "local" if local else "azure_blob", "relative_path": blob.relative_mount_path,
            "source": local or f"{blob.account_name}/{blob.container_name}",
            "account_name": None if local else blob.account_name,
            "mount_options": blob.mount_options,
        }, blob.credentials))
    for i, fs in enumerate(mv.file_servers):
        path, server = f"{prefix}.fileServers[{i}]", fs.file_server.id
        if server.lower().startswith("/subscriptions/"):
            _refuse(source, path, "Batch AI file servers are Azure resources batchyard cannot "
                    "reach; give the NFS server as host:/export instead", ignore)
            continue
        if ":/" not in server:
            _refuse(source, f"{path}.fileServer.id", f"{server!r}: give the NFS server as "
                    "host:/export", ignore)
            continue
        sub = (fs.source_directory or "").lstrip("/")
        found.append((path, {
            "kind": "file_server", "relative_path": fs.relative_mount_path,
            "source": f"{server.rstrip('/')}/{sub}" if sub else server,
            "mount_options": fs.mount_options,
        }, None))
    for i, um in enumerate(mv.unmanaged_file_systems):
        found.append((f"{prefix}.unmanagedFileSystems[{i}]", {
            "kind": "unmanaged", "relative_path": um.relative_mount_path,
            "mount_command": um.mount_command,
        }, None))
    mounts = []
    for path, mount, creds in found:
        if mount["kind"] not in REACHABLE_MOUNT_KINDS:
            _refuse(source, path, f"{mount['kind']} storage is not reachable from batchyard yet "
                    "(storage support comes later); mount it on the nodes and use a file:// "
                    "URL or an absolute path", ignore)
            continue
        if creds and mount["kind"] != "local":
            if creds.account_key_secret_reference is not None:
                _refuse(source, f"{path}.credentials.accountKeySecretReference",
                        "Azure Key Vault is not reachable here; give accountKey", ignore)
            mount["account_key"] = creds.account_key
        mounts.append({k: v for k, v in mount.items() if v is not None})
    return mounts


def _named(items: list[Any], path: str, key: str, source: str) -> None:
    seen: set[str] = set()
    for i, item in enumerate(items):
        value = getattr(item, key)
        if value in seen:
            raise _fail(source, f"{path}[{i}].{key}", f"duplicate {key} {value!r}")
        seen.add(value)


def _secrets(job: _Job, source: str, ignore: AbstractSet[str]) -> dict[str, str]:
    secrets: dict[str, str] = {}
    for i, secret in enumerate(job.secrets):
        ref = "keyVaultSecretReference" if secret.key_vault_secret_reference is not None else (
            "valueSecretReference" if secret.value_secret_reference is not None else None)
        if ref:
            _refuse(source, f"secrets[{i}].{ref}",
                    "Azure Key Vault is not reachable here; give the value instead", ignore)
            continue
        if secret.value is None:
            raise _fail(source, f"secrets[{i}].value", "required field is missing")
        secrets[secret.name] = secret.value
    return secrets


def wall_clock_seconds(value: str | int, source: str, path: str) -> float:
    """Batch AI wrote ``d.hh:mm:ss``; the REST wire format was ISO 8601 (``P7D``)."""
    iso = _ISO.match(value) if isinstance(value, str) and value not in ("P", "PT") else None
    if iso:
        d, h, m, s = (float(x or 0) for x in iso.groups())
        return d * 86400 + h * 3600 + m * 60 + s
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise _fail(source, path, str(exc)) from None


def _build(spec: dict[str, Any], source: str, framework: str) -> JobSpec:
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            loc = err["loc"]
            head = _NATIVE_TO_BATCHAI.get(str(loc[0]), framework) if loc else framework
            if loc[:1] == ("environment",) and len(loc) > 1:
                head = _ENVIRONMENT_TO_BATCHAI.get(str(loc[1]), framework)
            msg = str(err["msg"]).removeprefix("Value error, ")
            problems.append({"field": head, "message": f"{msg} ({field_path(loc)})"})
        text = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        raise SpecError(f"{source}: {text}", details=problems) from None


def read_batchai_job(
    data: dict[str, Any], *, ignore: AbstractSet[str] = frozenset(), source: str = "job.json"
) -> JobSpec:
    """A Batch AI job.json (wrapped in ``properties`` or bare) as the native JobSpec."""
    job: _Job = _validate(_Job, _unwrap(data, source), source)
    for path, key in (("inputDirectories", "id"), ("outputDirectories", "id"),
                      ("environmentVariables", "name"), ("secrets", "name")):
        _named(getattr(job, _snake(path)), path, key, source)
    spec: dict[str, Any] = _framework(job, source)
    framework = next(k for k in FRAMEWORKS if getattr(job, _snake(k)) is not None)
    spec["nodes"] = job.node_count
    if job.cluster:
        spec["cluster"] = job.cluster.id.rstrip("/").rsplit("/", 1)[-1]
    if job.job_preparation:
        spec["prepare"] = job.job_preparation.command_line
    if job.std_out_err_path_prefix:
        spec["stdouterr_path_prefix"] = job.std_out_err_path_prefix
    if job.scheduling_priority is not None:
        priority = job.scheduling_priority.lower()
        if priority not in ("low", "normal", "high"):
            raise _fail(source, "schedulingPriority", "must be low, normal or high")
        spec["priority"] = priority
    if job.constraints and job.constraints.max_wall_clock_time is not None:
        spec["limits"] = {"max_wall_clock": wall_clock_seconds(
            job.constraints.max_wall_clock_time, source, "constraints.maxWallClockTime")}
    spec["env"] = {e.name: str(e.value) for e in job.environment_variables}
    spec["secrets"] = _secrets(job, source, ignore)
    clash = sorted(set(spec["env"]) & set(spec["secrets"]))
    if clash:
        raise _fail(source, "secrets", f"{', '.join(clash)} also set in environmentVariables")
    spec["inputs"] = {d.id: {"path": d.path, "mode": "direct"} for d in job.input_directories}
    spec["outputs"] = {
        d.id: {"path_prefix": d.path_prefix, "path_suffix": d.path_suffix}
        for d in job.output_directories
    }
    if job.mount_volumes:
        spec["mounts"] = _mounts(job.mount_volumes, source, ignore)
    if job.container_settings is not None:
        spec["environment"] = {**spec.get("environment", {}), **batchai_environment(
            job.container_settings, spec["secrets"], source)}
    return _build(spec, source, framework)


def read_batchai_cluster(
    data: dict[str, Any], name: str, *, ignore: AbstractSet[str] = frozenset(),
    source: str = "cluster.json",
) -> ClusterSpec:
    """A Batch AI cluster.json as a ClusterSpec named ``name`` (the CLI's ``-n``)."""
    cl: _Cluster = _validate(_Cluster, _unwrap(data, source), source)
    try:
        lookup(cl.vm_size)
    except SpecError as exc:
        raise _fail(source, "vmSize", exc.message.removeprefix("vm_size: ")) from None
    spec: dict[str, Any] = {"name": name, "vm_size": cl.vm_size}
    if cl.vm_priority is not None:
        if cl.vm_priority.lower() not in ("dedicated", "lowpriority"):
            raise _fail(source, "vmPriority", "must be dedicated or lowpriority")
        spec["vm_priority"] = cl.vm_priority.lower()
    if cl.subnet is not None:
        _refuse(source, "subnet", "batchyard nodes are not placed in Azure virtual networks",
                ignore)
    if cl.virtual_machine_configuration is not None:
        _refuse(source, "virtualMachineConfiguration",
                "nodes run the host's own OS; custom VM images cannot be honoured", ignore)
    scale = cl.scale_settings
    if scale and scale.manual and scale.auto_scale:
        raise _fail(source, "scaleSettings", "give manual or autoScale, not both")
    if scale and scale.manual:
        option = (scale.manual.node_deallocation_option or "requeue").lower()
        if option not in ("requeue", "terminate", "waitforjobcompletion"):
            raise _fail(source, "scaleSettings.manual.nodeDeallocationOption",
                        "must be requeue, terminate or waitforjobcompletion")
        spec["manual"] = {"target_node_count": scale.manual.target_node_count,
                          "node_deallocation_option": option}
    if scale and scale.auto_scale:
        auto = scale.auto_scale
        if auto.minimum_node_count > auto.maximum_node_count:
            raise _fail(source, "scaleSettings.autoScale.minimumNodeCount",
                        "must not exceed maximumNodeCount")
        spec["autoscale"] = {"min_nodes": auto.minimum_node_count,
                             "max_nodes": auto.maximum_node_count,
                             "initial_node_count": auto.initial_node_count}
    setup = cl.node_setup
    if setup and setup.performance_counters_settings is not None:
        _refuse(source, "nodeSetup.performanceCountersSettings",
                "Application Insights is not reachable here", ignore)
    if setup and setup.mount_volumes:
        mounts = _mounts(setup.mount_volumes, source, ignore, prefix="nodeSetup.mountVolumes")
        if mounts:
            _refuse(source, "nodeSetup.mountVolumes", "cluster-wide mounts are not supported; "
                    "move them to the job's mountVolumes", ignore)
    if setup and setup.setup_task:
        task = setup.setup_task
        _named(task.environment_variables, "nodeSetup.setupTask.environmentVariables", "name",
               source)
        if task.secrets:
            _refuse(source, "nodeSetup.setupTask.secrets",
                    "setup-task secrets are not supported; use environmentVariables", ignore)
        spec["setup_task"] = {"command": task.command_line,
                              "env": {e.name: str(e.value) for e in task.environment_variables}}
    try:
        return ClusterSpec.model_validate(spec)
    except ValidationError as exc:
        raise spec_error_from(exc, source) from None
