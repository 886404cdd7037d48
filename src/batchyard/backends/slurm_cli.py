"""Slurm's command line as data: `sinfo --json`, `squeue --json`, `sbatch --parsable`,
`scancel`. Only machine-readable output is parsed (never the human tables), and
the parsers are pure functions so they are tested on JSON captured from a real Slurm.

Field names follow Slurm 22.05's data_parser; later versions wrap numbers as
``{"set": true, "number": N}`` and states as lists, which the readers accept too."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from batchyard.errors import BackendError

TIMEOUT = 30.0

# Node states that make a node unable to take a job (Slurm's base states and flags).
UNUSABLE = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING",
            "MAINTENANCE", "MAINT", "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN",
            "INVALID_REG", "FUTURE", "UNKNOWN", "REBOOT_ISSUED", "REBOOT_REQUESTED"}
# Node states of a node that failed under its jobs (not an administrator's drain).
FAILED = {"DOWN", "NOT_RESPONDING", "FAIL", "FAILING", "POWER_DOWN", "POWERED_DOWN",
          "POWERING_DOWN"}
# Job states in which the job still holds, or waits for, an allocation.
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING",
         "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SIGNALING", "STAGE_OUT", "STOPPED",
         "RESV_DEL_HOLD", "SPECIAL_EXIT"}
STARTED = {"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED"}

# Slurm's pending reasons, in plain words (the reason word itself is always shown too).
REASONS = {
    "None": "just submitted; the Slurm scheduler has not looked at it yet",
    "Resources": "the nodes it needs are busy",
    "Priority": "jobs of higher priority are queued ahead of it",
    "Dependency": "it waits for another Slurm job",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit exceeds the partition's",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "BeginTime": "its start time has not come yet",
    "QOSMaxJobsPerUserLimit": "the QOS allows no more running jobs for this user",
    "QOSMaxCpuPerUserLimit": "the QOS allows no more CPUs for this user",
    "QOSMaxGRESPerUser": "the QOS allows no more GPUs for this user",
    "QOSMaxNodePerUserLimit": "the QOS allows no more nodes for this user",
    "QOSGrpCpuLimit": "the QOS group's CPU limit is reached",
    "QOSGrpNodeLimit": "the QOS group's node limit is reached",
    "AssocMaxJobsLimit": "the account allows no more running jobs",
    "AssocGrpCpuLimit": "the account's CPU limit is reached",
    "AssocGrpNodeLimit": "the account's node limit is reached",
    "Licenses": "it waits for a license",
    "Reservation": "it waits for its reservation",
    "BadConstraints": "no node matches its constraints",
    "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority"
    "_partitions": "its nodes are down, drained or reserved for other partitions",
}


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str
    cpus: int
    memory_mb: int
    gpus: int
    states: tuple[str, ...]
    reason: str
    partitions: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return not (set(self.states) & UNUSABLE)

    @property
    def failed(self) -> bool:
        return bool(set(self.states) & FAILED)

    @property
    def why_unusable(self) -> str:
        state = "+".join(self.states) or "UNKNOWN"
        return f"Slurm node {state}" + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    states: tuple[str, ...]
    reason: str
    nodes: tuple[str, ...]
    batch_host: str
    comment: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def state(self) -> str:
        return self.states[0] if self.states else "UNKNOWN"

    @property
    def alive(self) -> bool:
        return self.state in ALIVE

    @property
    def started(self) -> bool:
        """Holding its nodes: running, or configuring them with the batch script on its way
        (its launchers may already be asking for their plans)."""
        return self.state in STARTED or (self.state == "CONFIGURING" and bool(self.nodes))

    def pending_text(self) -> str:
        word = self.reason or "None"
        plain = REASONS.get(word.split(",")[0].strip(), "")
        if word.startswith("ReqNodeNotAvail"):
            plain = REASONS["ReqNodeNotAvail"]
        text = f"Slurm job {self.job_id} pending: {word}"
        return f"{text} ({plain})" if plain else text


# --- pure parsing -------------------------------------------------------------------------

def _number(value: Any, default: int = 0) -> int:
    if isinstance(value, dict):
        if value.get("infinite"):
            return default
        value = value.get("number", default) if value.get("set", True) else default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _states(value: Any, flags: Any = None) -> tuple[str, ...]:
    out: list[str] = []
    for item in (value if isinstance(value, list) else [value]):
        if isinstance(item, str) and item:
            out.extend(s for s in item.upper().replace("+", " ").split() if s)
    for item in flags or []:
        if isinstance(item, str) and item.upper() not in out:
            out.append(item.upper())
    return tuple(out)


def gres_gpus(gres: Any) -> int:
    """GPUs in a Gres string such as ``gpu:2``, ``gpu:a100:4(S:0-1)``, ``gpu:1,shard:4``."""
    total = 0
    text = gres if isinstance(gres, str) else ""
    for part in re.split(r",(?![^()]*\))", text):
        part = re.sub(r"\(.*?\)", "", part).strip()
        bits = part.split(":")
        if bits[0] != "gpu":
            continue
        count = bits[-1] if len(bits) > 1 else "1"
        total += int(count) if count.isdigit() else 1
    return total


def parse_nodes(data: dict[str, Any]) -> list[SlurmNode]:
    nodes = []
    for raw in data.get("nodes") or []:
        name = str(raw.get("name") or raw.get("hostname") or "")
        if not name:
            continue
        parts = raw.get("partitions") or []
        nodes.append(SlurmNode(
            name=name, address=str(raw.get("address") or name),
            cpus=_number(raw.get("cpus"), 1), memory_mb=_number(raw.get("real_memory")),
            gpus=gres_gpus(raw.get("gres")), states=_states(raw.get("state"),
                                                            raw.get("state_flags")),
            reason=str(raw.get("reason") or ""),
            partitions=tuple(parts.split(",") if isinstance(parts, str) else parts),
        ))
    return nodes


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``sn[1-3,5],gpu[01-02]``) in Slurm's order."""
    out: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text or ""):
        out.extend(_expand_one(item.strip()))
    return [h for h in out if h]


def _expand_one(item: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if not match:
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    names = []
    for rng in match.group(1).split(","):
        lo, _, hi = rng.partition("-")
        width = len(lo)
        for i in range(int(lo), int(hi or lo) + 1):
            names.extend(_expand_one(f"{head}{i:0{width}d}{tail}"))
    return names


def parse_jobs(data: dict[str, Any]) -> list[SlurmJob]:
    jobs = []
    for raw in data.get("jobs") or []:
        allocated = (raw.get("job_resources") or {}).get("allocated_nodes") or []
        names = [str(n.get("nodename")) for n in allocated
                 if isinstance(n, dict) and n.get("nodename")]
        if not names:
            names = expand_hostlist(str(raw.get("nodes") or ""))
        jobs.append(SlurmJob(
            job_id=_number(raw.get("job_id")), name=str(raw.get("name") or ""),
            states=_states(raw.get("job_state")), reason=str(raw.get("state_reason") or ""),
            nodes=tuple(names), batch_host=str(raw.get("batch_host") or ""),
            comment=str(raw.get("comment") or ""), raw=raw,
        ))
    return jobs


def parse_job_id(out: str) -> int:
    """``sbatch --parsable`` prints ``ID`` or ``ID;CLUSTER``."""
    first = out.strip().splitlines()[-1] if out.strip() else ""
    head = first.split(";", 1)[0].strip()
    if not head.isdigit():
        raise BackendError(f"sbatch answered {out.strip()!r}, not a job id")
    return int(head)


# --- the commands -------------------------------------------------------------------------

def tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise BackendError(f"slurm: {name} not found on the server's PATH (the server must "
                           "run on a Slurm login node: slurm-client and munge)")
    return found


def run(argv: list[str], stdin: str | None = None, timeout: float = TIMEOUT,
        check: bool = True, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    argv = [tool(argv[0]), *argv[1:]]
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ) if env is None else env)
    except subprocess.TimeoutExpired:
        raise BackendError(f"slurm: {argv[0]} did not answer within {timeout:.0f} s "
                           "(is slurmctld up?)") from None
    if check and proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        raise BackendError(f"slurm: {os.path.basename(argv[0])} failed: "
                           f"{message[-1] if message else f'exit code {proc.returncode}'}")
    return proc


def _json(argv: list[str]) -> dict[str, Any]:
    out = run(argv).stdout
    try:
        data: dict[str, Any] = json.loads(out)
    except ValueError:
        raise BackendError(f"slurm: {argv[0]} --json gave no JSON") from None
    return data


def nodes(partition: str | None = None) -> list[SlurmNode]:
    """`sinfo --json`: one record per node (22.05 has no `scontrol show node --json`)."""
    found = parse_nodes(_json(["sinfo", "--json"]))
    if partition:
        found = [n for n in found if partition in n.partitions]
    return found


def partitions() -> list[str]:
    seen: dict[str, None] = {}
    for node in nodes():
        seen.update(dict.fromkeys(node.partitions))
    return list(seen)


def jobs(job_ids: list[int] | None = None, name: str | None = None) -> list[SlurmJob]:
    """Jobs Slurm still knows (a job that ended longer ago than MinJobAge is forgotten).
    22.05's `squeue --json` ignores squeue's filters: it answers every job, filtered here."""
    found = parse_jobs(_json(["squeue", "--json"]))
    if job_ids is not None:
        wanted = set(job_ids)
        found = [j for j in found if j.job_id in wanted]
    if name is not None:
        found = [j for j in found if j.name == name]
    return found


def submit(script: str, test_only: bool = False, env: dict[str, str] | None = None) -> int:
    """``env``: sbatch's whole environment (under --export=ALL, the job's too)."""
    if test_only:
        run(["sbatch", "--test-only"], stdin=script, env=env)
        return 0
    return parse_job_id(run(["sbatch", "--parsable"], stdin=script, env=env).stdout)


def cancel(job_id: int, signal: str | None = None) -> None:
    argv = ["scancel"] + ([f"--signal={signal}"] if signal else []) + [str(job_id)]
    run(argv, check=False)
