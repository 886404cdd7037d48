"""A passing pre-flight on a real 2-node local cluster: both launchers probe each other (the
figures land in their launcher logs and in the attempt's node reports), the GPU check notes a
node without GPUs, the job's events record the verdict, and only then do the ranks start."""

from __future__ import annotations

import pytest

from yardkit import Yard

pytestmark = [pytest.mark.timeout(300)]


def test_preflight_all_passes_and_shows_its_figures(yard: Yard, cluster2: str) -> None:
    job_file = yard.write_job("pf", {"nodes": 2, "preflight": "all",
                                     "distribution": {"type": "pytorch",
                                                      "processes_per_node": 1},
                                     "command": "echo rank $RANK ran"})
    yard.ok("job", "create", "-f", str(job_file), "-n", "pf", "-c", cluster2)
    job = yard.wait_job("pf", timeout=120)
    assert job["state"] == "succeeded", job
    assert len(job["attempts"]) == 1  # nothing placed again
    events = [e["message"] or "" for e in job["events"]]
    passed = [m for m in events if m.startswith("pre-flight passed on 2 nodes in ")]
    assert len(passed) == 1, events
    assert "network: 1 pair(s) measured, latency " in passed[0], passed
    assert "gpu: local2-0: no GPUs, local2-1: no GPUs" in passed[0], passed
    reports = yard.node_reports(job)
    pf0, pf1 = (r["preflight"] for r in reports)
    (link,) = pf0["links"]
    assert link["peer"] == "local2-1" and link["ok"] and link["bandwidth_MBps"] > 1, pf0
    assert pf1["links"][0]["ok"] and "bandwidth_MBps" not in pf1["links"][0], pf1
    logs = yard.attempt_dir(job) / "stdouterr"
    launcher0 = (logs / "local2-0-launcher.txt").read_text()
    assert f"pre-flight: local2-1 at {link['addr']}: ok, connect " in launcher0, launcher0
    assert " us (8 B), bandwidth " in launcher0 and " MB/s (4 MiB)" in launcher0, launcher0
    assert "pre-flight: gpu: ok: no GPUs" in launcher0, launcher0
    launcher1 = (logs / "local2-1-launcher.txt").read_text()
    assert f"pre-flight: local2-0 at {pf1['links'][0]['addr']}: ok" in launcher1, launcher1
    for text in (launcher0, launcher1):
        assert text.index("pre-flight passed on 2 nodes") < text.index("started 1 rank(s)"), text
    out = yard.ok("job", "logs", "-n", "pf").stdout
    assert "rank 0 ran" in out and "rank 1 ran" in out, out


def test_cluster_default_preflight_and_bad_values(yard: Yard) -> None:
    bad = yard.cli("cluster", "create", "-n", "pfbad", "-s", "Standard_D2_v2", "-t", "2",
                   "--preflight", "sometimes")
    assert bad.rc == 2 and "preflight" in bad.stderr and "Traceback" not in bad.stderr, bad
    yard.ok("cluster", "create", "-n", "pfnet", "-s", "Standard_D2_v2", "-t", "2",
            "--preflight", "network")
    yard.wait_cluster("pfnet", 2)
    job_file = yard.write_job("pfdefault", {"nodes": 2, "command": "true",
                                            "distribution": {"type": "custom"}})
    yard.ok("job", "create", "-f", str(job_file), "-n", "pfdefault", "-c", "pfnet")
    job = yard.wait_job("pfdefault", timeout=120)
    assert job["state"] == "succeeded", job
    events = [e["message"] or "" for e in job["events"]]
    assert any(m.startswith("pre-flight passed on 2 nodes") and "network: 1 pair(s)" in m
               and "gpu" not in m for m in events), events
    # only an unusable node can be enabled
    idle = yard.cli("cluster", "node", "enable", "-c", "pfnet", "-n", "pfnet-0")
    assert idle.rc != 0 and "is idle, not unusable" in idle.stderr, idle
    missing = yard.cli("cluster", "node", "enable", "-c", "pfnet", "-n", "nope")
    assert missing.rc != 0 and "not found" in missing.stderr, missing
