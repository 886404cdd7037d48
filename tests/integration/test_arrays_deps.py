"""Job arrays and dependencies against a real server and real jobs: an array of 20 with %4
never has more than 4 jobs running (each job stamps its start and end into a file, and the
intervals are checked), each job sees its index as batchyard and Slurm name it, `job list`
shows the array as one row; a chain A -> B -> C runs in order, the waiting job's pending
reason names the job it waits for, and a failed A fails B and C with reasons naming A and B.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(240)

STAMP = ('echo "start $BATCHYARD_ARRAY_INDEX $(date +%s.%N)" >> "$MARKS/array.txt"; '
         'echo "$BATCHYARD_ARRAY_INDEX $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_JOB_ID '
         '$SLURM_ARRAY_TASK_COUNT $SLURM_ARRAY_TASK_MIN $SLURM_ARRAY_TASK_MAX" '
         '> "$MARKS/env-$BATCHYARD_ARRAY_INDEX.txt"; sleep 0.6; '
         'echo "end $BATCHYARD_ARRAY_INDEX $(date +%s.%N)" >> "$MARKS/array.txt"')


@pytest.fixture(scope="module")
def wide(yard: Yard) -> str:
    """Six one-vCPU nodes: room for more than 4 jobs at once, so the %4 is what limits."""
    yard.ok("cluster", "create", "-n", "wide", "-s", "Standard_D1_v2", "-t", "6")
    yard.wait_cluster("wide", 6)
    return "wide"


def most_at_once(path: Path) -> tuple[int, int]:
    """(the most jobs running at any moment, how many distinct jobs ran) from the stamps."""
    events = []
    seen = set()
    for line in path.read_text().splitlines():
        kind, index, stamp = line.split()
        events.append((float(stamp), 0 if kind == "end" else 1))
        seen.add(index)
    running = peak = 0
    for _, delta in sorted(events):  # an end at the same instant as a start comes first
        running += 1 if delta else -1
        peak = max(peak, running)
    return peak, len(seen)


def test_array_of_20_with_percent_4_never_runs_more_than_4(yard: Yard, wide: str,
                                                           tmp_path: Path) -> None:
    marks, mount = yard.exchange("marks")  # every job of the array writes there
    job_file = yard.write_job("sim", {"name": "sim", "command": STAMP,
                                      "env": {"MARKS": str(marks)}, "mounts": [mount],
                                      "distribution": {"type": "custom"}})
    made = yard.js("job", "create", "-f", str(job_file), "-c", wide, "--array", "0-19%4")
    assert made["count"] == 20 and made["limit"] == 4, made
    assert made["jobs"][0] == "sim_0" and made["jobs"][-1] == "sim_19"
    # while it runs, the jobs beyond the limit say why they wait
    def throttled() -> Any:
        view = yard.job("sim")
        return [j for j in view["jobs"] if j["state"] == "queued"
                and "at most 4" in (j["reason"] or "")]
    wait_until(throttled, 30, what="an array job waiting for the %4 limit")
    listed = yard.ok("job", "list", "-c", wide).stdout
    assert "sim[0-19] (20 jobs)" in listed, listed
    assert "sim_3 " not in listed  # one row for the whole array

    def done() -> bool:
        view = yard.job("sim")
        return view["job_states"].get("succeeded", 0) == 20
    wait_until(done, 150, 0.5, "all 20 jobs of the array to succeed")
    peak, ran = most_at_once(marks / "array.txt")
    assert ran == 20
    assert peak <= 4, f"{peak} jobs of the array ran at once"
    assert peak >= 2, "the array never ran jobs side by side"
    for index in (0, 7, 19):
        got = (marks / f"env-{index}.txt").read_text().split()
        assert got == [str(index), str(index), "sim", "20", "0", "19"], got
    one = yard.js("job", "show", "sim_7")
    assert one["array"] == "sim" and one["array_index"] == 7
    shown = yard.ok("job", "show", "sim").stdout
    assert "20 succeeded" in shown, shown


def submit(yard: Yard, name: str, command: str, cluster: str,
           depends: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    job_file = yard.write_job(name, {"name": name, "command": command,
                                     "distribution": {"type": "custom"}})
    args = ["job", "create", "-f", str(job_file), "-c", cluster]
    for dep in depends:
        args += ["--depends-on", dep]
    return dict(yard.js(*args))


def test_chain_runs_in_order_and_waits_with_a_reason(yard: Yard, wide: str,
                                                     tmp_path: Path) -> None:
    go = tmp_path / "go-a"
    submit(yard, "chain-a", f'while [ ! -e "{go}" ]; do sleep 0.1; done', wide)
    submit(yard, "chain-b", "sleep 0.2", wide, ["chain-a"])
    submit(yard, "chain-c", "true", wide, ["chain-b:succeeded"])
    yard.wait_job("chain-a", ("running",), timeout=30)
    time.sleep(1.0)  # passes of the scheduler: nodes are free, yet B and C wait
    b, c = yard.job("chain-b"), yard.job("chain-c")
    assert b["state"] == "queued" and c["state"] == "queued"
    assert b["pending_reason"] == "waiting for job chain-a to succeed (it is running)", b
    assert c["pending_reason"] == "waiting for job chain-b to succeed (it is queued)", c
    assert b["depends_on"] == [{"job": "chain-a", "condition": "succeeded"}]
    go.touch()
    a = yard.wait_job("chain-a", timeout=30)
    b = yard.wait_job("chain-b", timeout=30)
    c = yard.wait_job("chain-c", timeout=30)
    assert [a["state"], b["state"], c["state"]] == ["succeeded"] * 3
    assert b["started_at"] >= a["ended_at"] and c["started_at"] >= b["ended_at"]


def test_failed_job_fails_the_chain_with_reasons(yard: Yard, wide: str) -> None:
    submit(yard, "broken-a", "sleep 0.5; exit 3", wide)
    submit(yard, "broken-b", "true", wide, ["broken-a"])
    submit(yard, "broken-c", "true", wide, ["broken-b"])
    submit(yard, "cleanup", "true", wide, ["broken-a:failed"])  # afternotok: it runs
    submit(yard, "after-any", "true", wide, ["broken-a:finished"])
    a = yard.wait_job("broken-a", timeout=30)
    assert a["state"] == "failed" and a["exit_code"] == 3
    b = yard.wait_job("broken-b", timeout=30)
    c = yard.wait_job("broken-c", timeout=30)
    assert b["state"] == "failed" and not b["attempts"], b
    assert b["message"] == ("dependency never satisfied: job broken-a ended failed, and this "
                            "job needed it to succeed"), b
    assert c["state"] == "failed" and not c["attempts"], c
    assert c["message"] == ("dependency never satisfied: job broken-b ended failed, and this "
                            "job needed it to succeed"), c
    assert yard.wait_job("cleanup", timeout=30)["state"] == "succeeded"
    assert yard.wait_job("after-any", timeout=30)["state"] == "succeeded"
    failed = yard.cli("job", "show", "broken-c")
    assert "broken-b" in failed.stdout


def test_bad_array_and_dependency_are_refused_naming_the_field(yard: Yard, wide: str) -> None:
    job_file = yard.write_job("bad", {"name": "bad", "command": "true"})
    bad = yard.cli("job", "create", "-f", str(job_file), "-c", wide, "--array", "5-1")
    assert bad.rc == 2 and "--array" in bad.stderr and "ends before it starts" in bad.stderr
    missing = yard.cli("job", "create", "-f", str(job_file), "-c", wide, "--depends-on",
                       "no-such-job")
    assert missing.rc == 2 and "depends_on[0].job" in missing.stderr, missing
    resp = yard.http.post("/workspaces/default/jobs", json={
        "spec": {"command": "true", "array": "0-3%0"}, "cluster": wide})
    assert resp.status_code == 422 and "array" in resp.text, resp.text
