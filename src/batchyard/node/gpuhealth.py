"""The GPU half of a gang's pre-flight: an ``nvidia-smi -q -x`` health read of this node's
GPUs (uncorrectable ECC errors, pending page retirement or row remapping, a recovery action the
driver asks for), fatal XID events from the kernel log, and a tiny matmul per GPU in the job's
Python when it has torch. Standard library only (the launcher runs under ``python -S``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from typing import Any

from batchyard.launchplan import NodePlan

# XIDs that mean the GPU (not the job's code) is broken until it is reset or replaced
# (NVIDIA's XID catalogue); the others (13, 31, 43: mostly an application's faults) are not.
FATAL_XIDS = {
    48: "double-bit ECC error", 62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure", 74: "NVLink error",
    79: "GPU has fallen off the bus", 95: "uncontained ECC error", 119: "GSP RPC timeout",
    120: "GSP error", 140: "unrecovered ECC error",
}
_XID = re.compile(r"^(?:\[\s*(\d+(?:\.\d+)?)\])?.*?NVRM: Xid "
                  r"\(PCI:([0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+)[^)]*\): (\d+)", re.M)
XID_WINDOW = 3600.0  # seconds: older XIDs are history (a GPU reset since clears the fault)
_NONE = ("", "n/a", "none", "no", "not supported", "[n/a]")

MATMUL = r"""
import json, sys
try:
    import torch
except ImportError:
    print(json.dumps({"skipped": "torch is not installed in the job's Python"})); sys.exit(0)
out = []
for i in range(torch.cuda.device_count()):
    try:
        a = torch.randn(512, 512, device=f"cuda:{i}")
        got = (a @ a).cpu()
        want = a.cpu() @ a.cpu()
        ok = bool(torch.isfinite(got).all()) and bool(torch.allclose(got, want, rtol=1e-2,
                                                                      atol=1e-2))
        out.append({"device": i, "ok": ok, "error": None if ok else "wrong matmul result"})
    except Exception as exc:
        out.append({"device": i, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
print(json.dumps({"devices": out, "visible": torch.cuda.device_count()}))
"""


def bus_key(pci: str) -> str:
    """'00000000:3B:00.0' (nvidia-smi) and '0000:3b:00' (a kernel XID line) -> '0000:3b:00'."""
    parts = pci.lower().split(":")
    if len(parts) < 3:
        return pci.lower()
    return f"{parts[-3][-4:]:0>4}:{parts[-2]}:{parts[-1].split('.')[0]}"


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def _uncorrectable(group: ET.Element | None) -> int | None:
    """Uncorrectable counts of one ECC group, in the newer schema (``dram_uncorrectable``,
    ``sram_uncorrectable*``) and the older one (``double_bit/total``); None: not reported."""
    if group is None:
        return None
    counts = [_int(child.text) for child in group
              if child.tag.endswith("uncorrectable") or "_uncorrectable_" in child.tag]
    counts.append(_int(group.findtext("double_bit/total")))
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _yes(text: str | None) -> bool:
    return (text or "").strip().lower() == "yes"


def parse_smi_xml(text: str) -> list[dict[str, Any]]:
    """Each GPU of ``nvidia-smi -q -x`` in its order (nvidia-smi's index)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi -q -x gave no readable XML: {exc}") from None
    gpus = []
    for index, gpu in enumerate(root.iter("gpu")):
        recovery = (gpu.findtext("gpu_recovery_action") or "").strip()
        gpus.append({
            "index": index,
            "bus_id": gpu.get("id") or gpu.findtext("pci/pci_bus_id") or "",
            "name": (gpu.findtext("product_name") or "GPU").strip(),
            "uuid": (gpu.findtext("uuid") or "").strip(),
            "ecc_enabled": (gpu.findtext("ecc_mode/current_ecc") or "").strip() == "Enabled",
            "volatile_uncorrectable": _uncorrectable(gpu.find("ecc_errors/volatile")),
            "aggregate_uncorrectable": _uncorrectable(gpu.find("ecc_errors/aggregate")),
            "retirement_pending": _yes(gpu.findtext("retired_pages/pending_retirement"))
            or _yes(gpu.findtext("retired_pages/pending_blacklist")),
            "remap_pending": _yes(gpu.findtext("remapped_rows/remapped_row_pending")),
            "remap_failure": _yes(gpu.findtext("remapped_rows/remapped_row_failure")),
            "recovery_action": None if recovery.lower() in _NONE else recovery,
        })
    return gpus


def xid_events(kernel_log: str, since: float | None = None) -> dict[str, list[int]]:
    """XID numbers per GPU bus (``bus_key``) in a kernel log (``dmesg``); with ``since``
    (seconds after boot), only those logged from then on (lines without a time count)."""
    found: dict[str, list[int]] = {}
    for stamp, pci, xid in _XID.findall(kernel_log):
        if since is not None and stamp and float(stamp) < since:
            continue
        found.setdefault(bus_key(pci), []).append(int(xid))
    return found


def _uptime() -> float | None:
    try:
        with open("/proc/uptime") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def problems(gpu: dict[str, Any], xids: list[int] | None = None) -> list[str]:
    """Why a GPU is unhealthy, in plain words; empty when it is fine."""
    out = []
    if gpu.get("volatile_uncorrectable"):
        out.append(f"{gpu['volatile_uncorrectable']} uncorrectable ECC error(s) since the "
                   "driver loaded")
    if gpu.get("retirement_pending"):
        out.append("a page retirement is pending (reset the GPU)")
    if gpu.get("remap_failure"):
        out.append("row remapping failed")
    elif gpu.get("remap_pending"):
        out.append("a row remapping is pending (reset the GPU)")
    if gpu.get("recovery_action"):
        out.append(f"the driver asks for a recovery action: {gpu['recovery_action']}")
    fatal = sorted({x for x in xids or [] if x in FATAL_XIDS})
    if fatal:
        out.append("XID " + ", ".join(f"{x} ({FATAL_XIDS[x]})" for x in fatal)
                   + " in the kernel log within the last hour")
    return out


def _kernel_log(timeout: float) -> str | None:
    try:
        proc = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _wanted(listed: list[dict[str, Any]], wanted: list[int | str],
            smi: str) -> tuple[list[dict[str, Any]], list[int | str]]:
    """(the listed GPUs the node was given, the ids none of them matched): ids are indices,
    GPU UUIDs (or unique prefixes) and MIG UUIDs (their GPU's health is the device's)."""
    from batchyard.node.gpus import parse_list

    migs: dict[str, int | None] = {}
    if any(str(w).startswith("MIG-") for w in wanted):
        try:
            text = subprocess.run([smi, "-L"], capture_output=True, text=True,
                                  timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            text = ""
        migs = {m["uuid"]: m["index"] for m in parse_list(text)}
    chosen: list[dict[str, Any]] = []
    missing: list[int | str] = []
    for want in wanted:
        text = str(want)
        found = [g for g in listed if (text.isdigit() and g["index"] == int(text))
                 or (text.startswith("GPU-") and g["uuid"].startswith(text))
                 or (text.startswith("MIG-") and g["index"] == migs.get(text))]
        if len(found) != 1:
            missing.append(want)
        elif found[0] not in chosen:
            chosen.append(found[0])
    return chosen, missing


def _matmul(python: str | None, gpus: list[int | str], timeout: float) -> dict[str, Any]:
    python = python or sys.executable
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}
    try:
        proc = subprocess.run([python, "-c", MATMUL], capture_output=True, text=True,
                              timeout=max(1.0, timeout), env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"the matmul did not finish in {timeout:.0f} s"}
    except OSError as exc:
        return {"skipped": f"cannot run {python}: {exc}"}
    try:
        found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"the matmul failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip()[-300:]}"}
    return found


def check(plan: NodePlan, deadline: float) -> dict[str, Any]:
    """This node's GPU health: ``ok``, a one-line ``message`` and the per-GPU figures."""
    return check_gpus(list(plan.gpus or []), plan.python, deadline)


def check_gpus(wanted: list[int | str], python: str | None, deadline: float
               ) -> dict[str, Any]:
    """``check`` outside a job (the periodic health check): the GPUs by id, the matmul in
    ``python`` (the server's or agent's own when None)."""
    if not wanted:
        return {"ok": True, "gpus": [], "message": "no GPUs"}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"ok": False, "gpus": [], "message": f"GPUs {wanted} assigned, but "
                "nvidia-smi is not installed"}
    try:
        proc = subprocess.run([smi, "-q", "-x"], capture_output=True, text=True,
                              timeout=max(1.0, min(15.0, deadline - time.time())))
        listed = parse_smi_xml(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        listed, proc_error = None, str(exc)
    else:
        proc_error = proc.stderr.strip()[-300:]
    if listed is None:
        return {"ok": False, "gpus": [], "message": f"nvidia-smi -q -x failed: {proc_error}"}
    log = _kernel_log(3.0)
    up = _uptime()
    xids = xid_events(log, None if up is None else up - XID_WINDOW) if log is not None else {}
    report, bad = [], []
    given, missing = _wanted(listed, wanted, smi)
    for gpu in given:
        found = problems(gpu, xids.get(bus_key(gpu["bus_id"])))
        report.append({**gpu, "problems": found})
        if found:
            bad.append(f"GPU {gpu['index']} ({gpu['name']}, {gpu['bus_id']}): "
                       + "; ".join(found))
    if missing:
        bad.append(f"GPU(s) {missing} assigned but not listed by nvidia-smi")
    matmul = _matmul(python, wanted, deadline - time.time()) if not bad else {}
    for device in matmul.get("devices") or []:
        if not device.get("ok"):
            index = int(device["device"])
            name = wanted[index] if index < len(wanted) else index
            bad.append(f"matmul on GPU {name} failed: {device['error']}")
    if matmul.get("error"):
        bad.append(str(matmul["error"]))
    notes = [] if log is not None else ["kernel log not readable: XIDs not checked"]
    if matmul.get("skipped"):
        notes.append(f"matmul skipped: {matmul['skipped']}")
    if bad:
        return {"ok": False, "gpus": report, "message": "; ".join(bad)}
    done = f"{len(report)} GPU(s) healthy" + (
        ", matmul ok" if matmul.get("devices") else "")
    return {"ok": True, "gpus": report, "matmul": matmul,
            "message": "; ".join([done, *notes])}
