"""The nvidia-smi health read of a gang's pre-flight, on `nvidia-smi -q -x` output in the real
schema (newer drivers' dram/sram counters, older drivers' single/double-bit groups) and kernel
XID lines, plus the node-level check against an nvidia-smi that prints such output."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from batchyard.launchplan import NodePlan
from batchyard.node import gpuhealth

DATA = Path(__file__).resolve().parents[2] / "data" / "nvidia-smi"


def test_new_schema_counts_and_flags() -> None:
    gpus = gpuhealth.parse_smi_xml((DATA / "two-h100-one-bad.xml").read_text())
    assert [g["index"] for g in gpus] == [0, 1]
    good, bad = gpus
    assert good["bus_id"] == "00000000:1B:00.0" and good["name"] == "NVIDIA H100 80GB HBM3"
    assert good["ecc_enabled"] is True
    assert good["volatile_uncorrectable"] == 0 and good["aggregate_uncorrectable"] == 1
    assert not good["remap_pending"] and good["recovery_action"] is None
    assert gpuhealth.problems(good) == []  # old, aggregate errors alone are no reason
    assert bad["volatile_uncorrectable"] == 2 and bad["remap_pending"] is True
    assert bad["recovery_action"] == "Reset"
    found = gpuhealth.problems(bad)
    assert found == ["2 uncorrectable ECC error(s) since the driver loaded",
                     "a row remapping is pending (reset the GPU)",
                     "the driver asks for a recovery action: Reset"]


def test_old_schema_double_bit_and_pending_retirement() -> None:
    (gpu,) = gpuhealth.parse_smi_xml((DATA / "v100-old-schema.xml").read_text())
    assert gpu["volatile_uncorrectable"] == 1 and gpu["aggregate_uncorrectable"] == 1
    assert gpu["retirement_pending"] is True
    assert "a page retirement is pending (reset the GPU)" in gpuhealth.problems(gpu)


def test_unreadable_output_is_an_error() -> None:
    with pytest.raises(ValueError, match="no readable XML"):
        gpuhealth.parse_smi_xml("NVIDIA-SMI has failed because it couldn't communicate")


def test_xid_lines_by_bus() -> None:
    log = ("[ 12.3] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05\n"
           "[812.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
           "[900.0] NVRM: Xid (PCI:0000:1b:00): 13, pid=77, Graphics Exception\n")
    xids = gpuhealth.xid_events(log)
    assert xids == {"0000:3b:00": [79], "0000:1b:00": [13]}
    assert gpuhealth.xid_events(log, since=850.0) == {"0000:1b:00": [13]}  # 79 is history
    assert gpuhealth.xid_events("NVRM: Xid (PCI:0000:3b:00): 48, DBE", since=1e9) == {
        "0000:3b:00": [48]}  # no time on the line: it counts
    assert gpuhealth.bus_key("00000000:3B:00.0") == "0000:3b:00"
    gpu = {"volatile_uncorrectable": 0}
    assert gpuhealth.problems(gpu, xids["0000:1b:00"]) == []  # an application's fault
    assert gpuhealth.problems(gpu, xids["0000:3b:00"]) == [
        "XID 79 (GPU has fallen off the bus) in the kernel log within the last hour"]


def _plan(gpus: list[int] | None) -> NodePlan:
    return NodePlan(job_id=1, job_name="j", workspace="w", experiment="e", attempt=1,
                    attempt_uuid="u", node_rank=0, node_names=["a", "b"],
                    node_addrs=["127.0.0.1", "127.0.0.1"], distribution={"type": "custom"},
                    command="true", prepare=None, attempt_dir="/tmp/x", node_dir="/tmp",
                    checkpoint_dir="/tmp/c", master_addr="127.0.0.1", master_port=1,
                    gpus=gpus)


def test_node_without_gpus_passes_with_a_note() -> None:
    assert gpuhealth.check(_plan(None), 0) == {"ok": True, "gpus": [], "message": "no GPUs"}


def test_node_check_names_the_bad_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncat {DATA / 'two-h100-one-bad.xml'}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    import time

    result = gpuhealth.check(_plan([1]), time.time() + 20)
    assert result["ok"] is False
    assert result["message"].startswith(
        "GPU 1 (NVIDIA H100 80GB HBM3, 00000000:3B:00.0): 2 uncorrectable ECC error(s)")
    assert [g["index"] for g in result["gpus"]] == [1]
