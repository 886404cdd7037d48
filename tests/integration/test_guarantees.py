"""Guaranteed capacity, borrowing and reclaim on a real server (issue 35 §2).

Team teama is guaranteed the one node of cluster `shared`; team teamb has no guarantee. A
teamb job borrows the idle node; when teama submits, the borrowed job is preempted through
the preemption path: SIGTERM, the cluster's grace period (its handler writes its checkpoint
within it and is not killed before), the checkpoint dir kept, requeued without a retry. It
resumes from its checkpoint once teama's job is done. Bad guarantees are refused naming the
field: exit 2 on the CLI, 422 over HTTP, nothing stored lost."""

from __future__ import annotations

import re

import httpx
import pytest

from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(300)
WS, CLUSTER = "borrow", "shared"
GRACE = 10
CHECKPOINTER = """\
#!/bin/bash
f="$BATCHYARD_CHECKPOINT_DIR/step"
n=$(cat "$f" 2>/dev/null || echo 0)
echo "attempt $BATCHYARD_ATTEMPT resumes at $n"
on_term() {
  echo "SIGTERM at step $n"; sleep 3; echo $n > "$f"
  echo "checkpointed at $n after 3 s of the grace"; exit 143
}
trap on_term TERM
while [ "$n" -lt 40 ]; do n=$((n+1)); echo $n > "$f"; sleep 0.25 & wait $!; done
echo "finished at $n"
"""


def _user(yard: Yard, name: str, team: str) -> str:
    yard.ok("user", "create", name)
    token = yard.js("token", "create", "--user", name, "--name", "tests")["token"]
    yard.ok("role", "assign", "-w", WS, "--user", name, "--role", "contributor")
    yard.ok("team", "add", team, name)
    return str(token)


@pytest.fixture(scope="module")
def teams(yard: Yard) -> dict[str, str]:
    yard.ok("workspace", "create", WS)
    resp = yard.http.post(f"/workspaces/{WS}/clusters", json={
        "name": CLUSTER, "vm_size": "Standard_D2_v2", "manual": {"target_node_count": 1},
        "preemption_grace": GRACE})
    assert resp.status_code == 201, resp.text
    resp = yard.http.post(f"/workspaces/{WS}/clusters", json={
        "name": "gpu", "vm_size": "Standard_NC24",
        "autoscale": {"min_nodes": 0, "max_nodes": 2}})
    assert resp.status_code == 201, resp.text
    for team in ("teama", "teamb"):
        yard.ok("team", "create", team)
    tokens = {"teama": _user(yard, "ann", "teama"), "teamb": _user(yard, "bob", "teamb")}
    yard.wait_cluster(CLUSTER, 1, workspace=WS)
    shown = yard.js("cluster", "quota", "set", "-c", CLUSTER, "-w", WS, "--team", "teama",
                    "--nodes", "1")
    assert shown["guaranteed"] == 1 and shown["unit"] == "nodes", shown
    return tokens


def _submit(yard: Yard, token: str, name: str, spec: dict[str, object],
            files: dict[str, str] | None = None) -> None:
    path = yard.write_job(name, {"name": name, "nodes": 1, **spec}, files)
    result = yard.cli("job", "create", "-f", str(path), "-c", CLUSTER, "-w", WS,
                      env={"BATCHYARD_TOKEN": token})
    assert result.rc == 0, str(result)


def test_quota_list_and_gpus_on_a_gpu_cluster(yard: Yard, teams: dict[str, str]) -> None:
    rows = yard.js("cluster", "quota", "list", "-c", CLUSTER, "-w", WS)
    assert [(r["team"], r["guaranteed"], r["borrow_limit"]) for r in rows] == [
        ("teama", 1, None)]
    assert "teama" in yard.ok("cluster", "quota", "list", "-c", CLUSTER, "-w", WS).stdout
    # a GPU cluster's guarantees are in GPUs: 2 nodes of 4 GPUs at most (its autoscale max)
    made = yard.js("cluster", "quota", "set", "-c", "gpu", "-w", WS, "--team", "teamb",
                   "--gpus", "8", "--borrow-limit", "4")
    assert (made["guaranteed"], made["nodes"], made["borrow_limit"], made["unit"]) == (
        8, 2, 4, "GPUs"), made
    gone = yard.js("cluster", "quota", "remove", "-c", "gpu", "-w", WS, "--team", "teamb")
    assert gone["removed"] is True
    assert yard.js("cluster", "quota", "list", "-c", "gpu", "-w", WS) == []
    yard.ok("team", "create", "teamc")  # a removed team's guarantees go with it
    yard.ok("cluster", "quota", "set", "-c", "gpu", "-w", WS, "--team", "teamc", "--nodes", "1")
    yard.ok("team", "delete", "teamc")
    assert yard.js("cluster", "quota", "list", "-c", "gpu", "-w", WS) == []


@pytest.mark.parametrize("args, field", [
    (("-c", CLUSTER, "--team", "teama", "--nodes", "-1"), "--nodes"),
    (("-c", CLUSTER, "--team", "teamb", "--nodes", "1", "--borrow-limit", "-2"),
     "--borrow-limit"),
    (("-c", CLUSTER, "--team", "nosuch", "--nodes", "1"), "team"),
    (("-c", CLUSTER, "--team", "teama", "--nodes", "2"), "nodes"),  # the cluster has 1
    (("-c", CLUSTER, "--team", "teamb", "--nodes", "1"), "nodes"),  # 1 + teama's 1 > 1
    (("-c", CLUSTER, "--team", "teamb", "--gpus", "4"), "gpus"),  # no GPUs there
    (("-c", "gpu", "--team", "teamb", "--gpus", "12"), "gpus"),  # 8 GPUs at most
    (("-c", "gpu", "--team", "teamb", "--gpus", "6"), "gpus"),  # not whole nodes
    (("-c", CLUSTER, "--team", "teama"), "--gpus"),  # neither --gpus nor --nodes
])
def test_bad_guarantees_are_refused(yard: Yard, teams: dict[str, str], args: tuple[str, ...],
                                    field: str) -> None:
    result = yard.cli("cluster", "quota", "set", "-w", WS, *args)
    assert result.rc == 2, str(result)
    assert field in result.stderr + result.stdout, str(result)
    assert "Traceback" not in result.stderr


def test_bad_guarantees_over_http_are_422(yard: Yard, teams: dict[str, str]) -> None:
    path = f"/workspaces/{WS}/clusters/{CLUSTER}/guarantees"
    for team, body in (("teama", {"nodes": -1}), ("teama", {"nodes": 1, "borrow_limit": -1}),
                       ("nosuch", {"nodes": 1}), ("teama", {"nodes": 5}),
                       ("teamb", {"nodes": 1}), ("teama", {"gpus": 4})):
        resp = yard.http.put(f"{path}/{team}", json=body)
        assert resp.status_code == 422, (team, body, resp.text)
    rows = yard.http.get(path).json()
    assert [(r["team"], r["nodes"]) for r in rows] == [("teama", 1)]  # nothing stored lost
    ann = httpx.put(f"{yard.url}/api/v1{path}/teama", json={"nodes": 0}, timeout=30,
                    headers={"Authorization": f"Bearer {teams['teama']}"})
    assert ann.status_code == 403, ann.text  # guarantees are a server admin's to set


def test_borrowed_job_is_preempted_requeued_and_resumes(yard: Yard,
                                                        teams: dict[str, str]) -> None:
    _submit(yard, teams["teamb"], "b-ck", {"code": ".", "command": "bash ck.sh",
                                           "limits": {"max_retries": 0,  # saves at SIGTERM
                                                      "checkpoint_notice": 0}},
            {"ck.sh": CHECKPOINTER})  # no retry to use: the requeue must not need one
    yard.wait_job("b-ck", ("running",), timeout=60, workspace=WS)
    shown = yard.js("job", "show", "-n", "b-ck", "-w", WS)
    assert shown["capacity"] == "runs on borrowed capacity (team teama's guarantee)", shown
    text = yard.ok("job", "show", "-n", "b-ck", "-w", WS).stdout
    assert "runs on borrowed capacity (team teama's guarantee)" in " ".join(text.split())
    with httpx.Client(base_url=yard.url, timeout=60) as portal:  # the portal's job page
        signed = portal.post("/login", data={"token": yard.token, "next": "/"},
                             headers={"Origin": yard.url})
        assert signed.status_code == 303, signed.text
        page = portal.get(f"/ws/{WS}/exp/default/jobs/b-ck")
        assert page.status_code == 200, page.text
        shown_at = page.text.index('id="job-capacity"')
        assert "runs on borrowed capacity (team teama&#39;s guarantee)" in \
            page.text[shown_at:shown_at + 200], page.text[shown_at:shown_at + 200]

    def stepped() -> bool:
        logs = yard.ok("job", "logs", "-n", "b-ck", "-w", WS).stdout
        return "resumes at 0" in logs
    wait_until(stepped, 30, 0.3, "the borrowed job to start stepping")
    _submit(yard, teams["teama"], "a-own", {"command": "sleep 2"})

    def preempted() -> dict[str, object] | None:
        job = yard.job("b-ck", workspace=WS)
        return job if (job.get("capacity") or "").startswith("preempted") else None

    def owner_told() -> str | None:
        reason = yard.job("a-own", workspace=WS).get("pending_reason") or ""
        return reason if "b-ck" in reason else None
    told = wait_until(owner_told, 30, 0.1, "team A's job to say what it waits for")
    assert told == ("waiting for team teama's guaranteed capacity: b-ck on borrowed capacity "
                    "is being preempted to give it back"), told
    seen = wait_until(preempted, 30, 0.1, "the borrowed job to be preempted")
    assert seen["capacity"] == "preempted to give team teama's guaranteed capacity back"
    own = yard.wait_job("a-own", timeout=90, workspace=WS)
    assert own["state"] == "succeeded", own
    done = yard.wait_job("b-ck", timeout=120, workspace=WS)
    assert done["state"] == "succeeded", done
    assert [a["state"] for a in done["attempts"]] == ["preempted", "succeeded"]
    first = done["attempts"][0]
    assert own["attempts"][0]["created_at"] >= first["ended_at"] - 0.5, (own, first)
    events = [e["message"] or "" for e in done["events"]]
    said = [m for m in events if "preempted to give team teama's guaranteed capacity back"
            in m]
    assert said, events
    assert any("runs on borrowed capacity (team teama's guarantee)" in m for m in events)
    # the grace was honoured: the handler slept 3 s, then checkpointed, and was not killed
    log1 = yard.ok("job", "logs", "-n", "b-ck", "-w", WS, "--attempt", "1").stdout
    log2 = yard.ok("job", "logs", "-n", "b-ck", "-w", WS, "--attempt", "2").stdout
    saved = re.search(r"checkpointed at (\d+) after 3 s of the grace", log1)
    assert saved and "SIGTERM at step" in log1, log1
    step = int(saved.group(1))
    assert step > 0
    reclaim_at = next(e["ts"] for e in done["events"] if "SIGTERM" in (e["message"] or ""))
    assert first["ended_at"] - reclaim_at >= 3.0, (first, reclaim_at)
    # resumed from the checkpoint (the same node's checkpoint dir), no retry used
    assert f"resumes at {step}" in log2, log2
    assert "finished at 40" in log2, log2
    assert int(done["attempt"]) == 2 and done.get("capacity") is None
