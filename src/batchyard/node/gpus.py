"""GPU discovery: which GPUs this machine (or this process, when its own
``CUDA_VISIBLE_DEVICES`` narrows them) has, with each one's name, memory and UUID, from
``nvidia-smi --query-gpu``. ``discover_gpus`` is the one place this is asked; what a GPU is
doing (utilisation, memory in use) is sampled elsewhere (node/usage.py), and which virtual
node or agent of the machine gets which GPU is node/gpuclaims.py's.

A GPU's ``id`` is what goes into a job's ``CUDA_VISIBLE_DEVICES``: its index (nvidia-smi's
order, the PCI bus order, which every rank also gets as ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), or
its UUID where this machine was itself given UUIDs (``GPU-...``, or a MIG device's
``MIG-...``: an agent started by a container runtime, a Slurm step or a device plugin).
Standard library only (agents and launchers import it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

QUERY = "index,uuid,name,memory.total,pci.bus_id"
TIMEOUT = 10.0
# `nvidia-smi -L`: "GPU 0: NVIDIA H200 (UUID: GPU-...)", then its MIG devices indented:
# "  MIG 1g.18gb     Device  0: (UUID: MIG-...)"
_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)")


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def _run(smi: str, args: list[str], timeout: float) -> str | None:
    try:
        done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_query(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`` output, one GPU a line."""
    gpus = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) < 5 or _int(cells[0]) is None:
            continue
        index = int(cells[0])
        gpus.append({"id": index, "index": index, "uuid": cells[1] or None,
                     "name": cells[2] or None, "memory_mb": _int(cells[3]),
                     "bus_id": cells[4] or None})
    return gpus


def parse_list(text: str) -> list[dict[str, Any]]:
    """MIG devices in ``nvidia-smi -L`` output, each under its GPU."""
    migs, parent = [], None
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            parent = (int(gpu[1]), gpu[2].strip())
            continue
        mig = _MIG_LINE.match(line)
        if mig and parent is not None:
            migs.append({"id": mig[3], "index": parent[0], "uuid": mig[3],
                         "name": f"{parent[1]} MIG {mig[1]}", "memory_mb": None,
                         "bus_id": None, "mig": True})
    return migs


def _visible(token: str, listed: list[dict[str, Any]], smi: str | None,
             timeout: float) -> dict[str, Any] | None:
    """The device one entry of CUDA_VISIBLE_DEVICES names (an index, a GPU UUID or a unique
    prefix of one, a MIG UUID), with what nvidia-smi says about it."""
    if token.isdigit():
        found = next((g for g in listed if g["index"] == int(token)), None)
        return found or {"id": int(token), "index": int(token), "uuid": None, "name": None,
                         "memory_mb": None, "bus_id": None}
    if token.startswith("MIG-"):
        text = _run(smi, ["-L"], timeout) if smi else None
        mig = next((m for m in parse_list(text or "") if m["uuid"] == token), None)
        return mig or {"id": token, "index": None, "uuid": token, "name": None,
                       "memory_mb": None, "bus_id": None, "mig": True}
    if token.startswith("GPU-"):
        matches = [g for g in listed if str(g["uuid"] or "").startswith(token)]
        if len(matches) == 1:
            return {**matches[0], "id": token}
        return {"id": token, "index": None, "uuid": token, "name": None, "memory_mb": None,
                "bus_id": None}
    return None


def discover_gpus(environ: Mapping[str, str] | None = None,
                  timeout: float = TIMEOUT) -> list[dict[str, Any]]:
    """Each GPU (or MIG device) this process may use, in order: ``id`` (for
    CUDA_VISIBLE_DEVICES), ``index``, ``uuid``, ``name``, ``memory_mb``, ``bus_id``.
    [] without nvidia-smi, unless this process's CUDA_VISIBLE_DEVICES names devices."""
    env = os.environ if environ is None else environ
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    text = _run(smi, [f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                timeout) if smi else None
    listed = parse_query(text or "")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return listed
    out: list[dict[str, Any]] = []
    for token in (t.strip() for t in visible.split(",")):
        found = _visible(token, listed, smi, timeout) if token else None
        if found is None:  # CUDA stops at the first entry it cannot read (e.g. -1)
            break
        if all(g["id"] != found["id"] for g in out):
            out.append(found)
    return out


def key_of(gpu: dict[str, Any]) -> str:
    """What identifies a GPU across processes of one machine: its UUID, else its index."""
    return str(gpu.get("uuid") or f"index-{gpu.get('index', gpu.get('id'))}")


def describe(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a node records of its GPUs (node resources ``gpu_devices``)."""
    return [{k: g.get(k) for k in ("id", "index", "uuid", "name", "memory_mb")}
            for g in gpus]


def label(device: dict[str, Any]) -> str:
    """One GPU as people read it: ``0: NVIDIA H200, 140 GiB, GPU-8a3c6f1e`` (the UUID's
    first block, which CUDA_VISIBLE_DEVICES also takes)."""
    parts = [str(device.get("name") or "GPU")]
    if device.get("memory_mb"):
        parts.append(f"{int(device['memory_mb']) / 1024:.0f} GiB")
    uuid = str(device.get("uuid") or "")
    if uuid:
        parts.append(uuid if uuid.startswith("MIG-") else "-".join(uuid.split("-")[:2]))
    return f"{device.get('id')}: " + ", ".join(parts)


def models(devices: list[dict[str, Any]]) -> list[str]:
    """The distinct GPU models among ``devices``, in order."""
    return list(dict.fromkeys(str(d["name"]) for d in devices if d.get("name")))
