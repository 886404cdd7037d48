"""Azure ML's shapes for what a run is and what it logged, built from batchyard's views."""

from __future__ import annotations

from typing import Any

from batchyard.compat.azureml._common import aml_status, iso
from batchyard.compat.azureml._submission import aml_file_name
from batchyard.sdk import pip

COMMUNICATOR = {"mpi": "Mpi", "pytorch": "TorchDistributed", "tensorflow": "ParameterServer",
                "custom": "None"}


def run_details(job: dict[str, Any], files: list[dict[str, Any]], file_url: str) -> dict[str, Any]:
    """``Run.get_details()`` from ``GET …/jobs/{name}`` and its file listing."""
    spec = job.get("spec") or {}
    dist = spec.get("distribution") or {}
    command = _unwrapped(spec.get("command"))
    script, arguments = None, []
    if isinstance(command, list) and len(command) > 1 and command[0] == "python":
        script, arguments = command[1], command[2:]
    code = spec.get("code") or ""
    details: dict[str, Any] = {
        "runId": job["name"],
        "target": job.get("cluster"),
        "status": aml_status(job.get("state")),
        "startTimeUtc": iso(job.get("started_at")),
        "endTimeUtc": iso(job.get("ended_at")),
        "properties": {
            "azureml.runsource": "experiment",
            "ContentSnapshotId": code.split(":", 1)[1] if code.startswith("snapshot:") else None,
            "batchyard.workspace": job.get("workspace"),
            "batchyard.experiment": job.get("experiment"),
            "batchyard.attempt": str(job.get("attempt")),
            "batchyard.state": job.get("state"),
            "batchyard.exitCode": None if job.get("exit_code") is None
            else str(job.get("exit_code")),
        },
        "inputDatasets": [],
        "outputDatasets": [],
        "runDefinition": {
            "script": script,
            "arguments": arguments,
            "command": None if script else command,
            "target": job.get("cluster"),
            "framework": (spec.get("tags") or {}).get("azureml.framework", "Python"),
            "communicator": COMMUNICATOR.get(str(dist.get("type")), "None"),
            "nodeCount": job.get("nodes"),
            "processCountPerNode": dist.get("processes_per_node", 1),
            "maxRunDurationSeconds": (spec.get("limits") or {}).get("max_wall_clock"),
            "environment": {"environmentVariables": spec.get("env") or {}},
        },
        "logFiles": {aml_file_name(f["path"]): f"{file_url}?path={f['path']}"
                     for f in files if str(f["path"]).startswith("stdouterr/")},
        "submittedBy": None,
    }
    if job.get("state") == "failed":
        details["error"] = run_error(job)
    if job.get("pending_reason"):
        details["warnings"] = [{"message": job["pending_reason"]}]
    return details


# batchyard's failure causes as AML's inner error codes; the ones no user code caused are
# SystemError, the rest UserError (as AML reports an OOM or a failed script)
INNER_CODES = {"oom": "OutOfMemory", "nccl/gloo timeout": "CollectiveTimeout",
               "node lost": "NodeLost", "preempted": "Preempted",
               "wall clock": "MaxRunDurationExceeded", "user code error": "ExecutionFailed",
               "preparation failed": "JobPreparationFailed",
               "image pull failed": "ImagePullFailed", "hung": "JobHung",
               "process limit": "ProcessLimitExceeded", "output limit": "OutputLimitExceeded"}
SYSTEM_CAUSES = ("node lost", "preempted")


def run_error(job: dict[str, Any]) -> dict[str, Any]:
    """AML's error response of a failed run: ``{"error": {"code", "message", "innerError",
    "details", "additionalInfo"}, "time", "componentName"}``, the cause in the inner code
    and batchyard's own record (rank, node, error lines) in additionalInfo."""
    message = job.get("message") or f"exit code {job.get('exit_code')}"
    root: dict[str, Any] = {"code": "UserError", "message": message}
    found = job.get("error")
    if isinstance(found, dict) and found.get("cause"):
        cause = str(found["cause"])
        root["code"] = "SystemError" if cause in SYSTEM_CAUSES else "UserError"
        root["innerError"] = {"code": INNER_CODES.get(cause, "KilledBySignal")}
        root["details"] = [{"code": "ErrorLines", "message": "\n".join(found.get("lines") or [])}]
        root["additionalInfo"] = [{"type": "BatchyardFailure", "info": found}]
    return {"error": root, "time": iso(job.get("ended_at")), "componentName": "batchyard"}


def _unwrapped(command: Any) -> Any:
    """The user's argv again when pip_packages wrapped it into a shell line."""
    if isinstance(command, str) and command.startswith(pip.wrap_command("")):
        import shlex

        return shlex.split(command[len(pip.wrap_command("")):])
    return command


def aggregate_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``Run.get_metrics()``: a value logged once is itself, several form a list; rows and
    tables become column -> list of values."""
    out: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for row in rows:
        name, kind, value = row["name"], row.get("kind", "scalar"), row["value"]
        if kind in ("row", "table") and isinstance(value, dict):
            columns = out.setdefault(name, {})
            for column, cell in value.items():
                cells = columns.setdefault(column, [])
                cells.extend(cell if kind == "table" and isinstance(cell, list) else [cell])
            continue
        seen = counts.get(name, 0)
        if seen == 0:
            out[name] = value
        elif seen == 1:
            out[name] = [out[name], value]
        else:
            out[name].append(value)
        counts[name] = seen + 1
    return out
