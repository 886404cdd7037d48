"""Preemption asks first (issue 36 §2), on a real server with the local backend.

`cluster node preempt` on a running job's node: the rank gets SIGUSR1 (its handler writes a
mark), batchyard.should_checkpoint() turns True, it saves and calls
batchyard.checkpoint_saved(step); the SIGTERM follows at once rather than at the end of the
notice. The job is requeued and its next attempt resumes from the saved step; the events and
`job show` say what was lost. Bad notice settings are refused at submit naming the field."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from yardkit import Yard

pytestmark = pytest.mark.timeout(300)
NOTICE = 20  # long enough that stopping before its end shows the checkpoint ended it
TRAINER = """\
import os, signal, sys, time
import batchyard

store = sys.argv[1]  # a local mount: the replacement node sees what the preempted one saved
saved = os.path.join(store, "step")
step = int(open(saved).read()) if os.path.exists(saved) else 0
attempt = os.environ["BATCHYARD_ATTEMPT"]
print(f"attempt {attempt} resumes at {step}", flush=True)
told = []
signal.signal(signal.SIGUSR1, lambda *_: told.append(time.time()))

def on_term(*_):
    print(f"SIGTERM at step {step}", flush=True)
    sys.exit(143)

signal.signal(signal.SIGTERM, on_term)
while step < 40:
    if told:
        told.clear()
        with open(os.path.join(os.environ["BATCHYARD_CHECKPOINT_DIR"], "notice"), "w") as fh:
            fh.write(f"SIGUSR1 at step {step}\\n")
        print(f"SIGUSR1 at step {step} should_checkpoint={batchyard.should_checkpoint()}",
              flush=True)
        with open(saved + ".tmp", "w") as fh:
            fh.write(str(step))
        os.replace(saved + ".tmp", saved)
        batchyard.checkpoint_saved(step)
        print(f"saved step {step}", flush=True)
    elif attempt == "1" and step and step % 10 == 0:
        with open(saved, "w") as fh:
            fh.write(str(step))
        batchyard.checkpoint_saved(step)
    step += 1
    time.sleep(0.25)
print(f"finished at {step} should_checkpoint={batchyard.should_checkpoint()}", flush=True)
"""


def _submit(yard: Yard, name: str, cluster: str, limits: dict[str, object]) -> None:
    store, mount = yard.exchange(f"store-{name}")
    path = yard.write_job(name, {"name": name, "nodes": 1, "code": ".", "mounts": [mount],
                                 "command": f"python trainer.py {store}", "limits": limits},
                          {"trainer.py": TRAINER})
    yard.ok("job", "create", "-f", str(path), "-c", cluster)


def test_preempted_job_is_told_saves_and_resumes(yard: Yard) -> None:
    yard.ok("cluster", "create", "-n", "spot", "-s", "Standard_D2_v2", "-t", "1",
            "--vm-priority", "lowpriority", "--provisioning-delay", "1")
    yard.wait_cluster("spot", 1)
    _submit(yard, "told", "spot", {"checkpoint_notice": f"{NOTICE}s", "max_retries": 0})
    yard.wait_job("told", ("running",), timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline:  # past its first periodic checkpoint (step 10)
        shown = yard.js("job", "show", "-n", "told")
        if (shown.get("checkpoint") or {}).get("step") == 10:
            break
        time.sleep(0.3)
    assert shown["checkpoint"]["step"] == 10, shown
    text = " ".join(yard.ok("job", "show", "-n", "told").stdout.split())
    assert "Last checkpoint" in text and "step 10" in text, text
    with httpx.Client(base_url=yard.url, timeout=60) as portal:  # the portal's job page
        signed = portal.post("/login", data={"token": yard.token, "next": "/"},
                             headers={"Origin": yard.url})
        assert signed.status_code == 303, signed.text
        page = portal.get("/ws/default/exp/default/jobs/told")
        assert page.status_code == 200, page.text
        at = page.text.index('id="job-checkpoint"')
        assert "step 10, " in page.text[at:at + 120], page.text[at:at + 120]
    node = yard.js("cluster", "node", "list", "-c", "spot")[0]["name"]
    asked = time.time()
    yard.ok("cluster", "node", "preempt", "-c", "spot", "-n", node)
    done = yard.wait_job("told", timeout=120)
    assert done["state"] == "succeeded", done
    assert [a["state"] for a in done["attempts"]] == ["preempted", "succeeded"]
    first = done["attempts"][0]
    # the checkpoint in the notice ended it: SIGTERM long before the notice was over
    assert first["ended_at"] - asked < NOTICE - 5, (first, asked)
    log1 = yard.ok("job", "logs", "-n", "told", "--attempt", "1").stdout
    log2 = yard.ok("job", "logs", "-n", "told", "--attempt", "2").stdout
    told = re.search(r"SIGUSR1 at step (\d+) should_checkpoint=True", log1)
    assert told, log1
    step = int(told.group(1))
    assert f"saved step {step}" in log1 and "SIGTERM at step" in log1, log1
    assert log1.index(f"saved step {step}") < log1.index("SIGTERM at step"), log1
    assert f"attempt 2 resumes at {step}" in log2, log2
    assert "finished at 40 should_checkpoint=False" in log2, log2
    events = [e["message"] or "" for e in done["events"]]
    lost = [m for m in events if re.search(
        rf"preempted \d+ s after its last checkpoint \(step {step}\)", m)]
    assert lost, events
    said = re.search(r"preempted (\d+) s after", lost[0])
    assert said and int(said.group(1)) <= 3, lost
    assert re.search(rf"preempted \d+ s after its last checkpoint \(step {step}\)",
                     first["message"] or ""), first
    assert done["checkpoint"]["step"] == step, done


def test_a_job_that_never_saves_waits_out_the_notice(yard: Yard) -> None:
    """checkpoint_signal none: no signal, only the file; nothing reported, so the SIGTERM
    comes at the notice's end and the event says no checkpoint was saved in this attempt."""
    yard.ok("cluster", "create", "-n", "spot2", "-s", "Standard_D2_v2", "-t", "1",
            "--vm-priority", "lowpriority", "--provisioning-delay", "1")
    yard.wait_cluster("spot2", 1)
    script = yard.write_job("quiet", {
        "name": "quiet", "nodes": 1, "code": ".", "command": "python quiet.py",
        "limits": {"checkpoint_notice": "3s", "checkpoint_signal": "none"}},
        {"quiet.py": "import batchyard, time\n"
                     "while not batchyard.should_checkpoint():\n    time.sleep(0.1)\n"
                     "print('notice seen', flush=True)\ntime.sleep(600)\n"})
    yard.ok("job", "create", "-f", str(script), "-c", "spot2")
    yard.wait_job("quiet", ("running",), timeout=30)
    time.sleep(1.0)
    node = yard.js("cluster", "node", "list", "-c", "spot2")[0]["name"]
    asked = time.time()
    yard.ok("cluster", "node", "preempt", "-c", "spot2", "-n", node)
    deadline = time.time() + 60
    while time.time() < deadline:
        job = yard.job("quiet")
        if job["attempts"] and job["attempts"][0]["state"] == "preempted":
            break
        time.sleep(0.3)
    first = job["attempts"][0]
    assert first["state"] == "preempted", job
    assert first["ended_at"] - asked >= 3.0, (first, asked)
    assert "with no checkpoint reported" in (first["message"] or ""), first
    log1 = yard.ok("job", "logs", "-n", "quiet", "--attempt", "1").stdout
    assert "notice seen" in log1, log1
    yard.ok("job", "terminate", "-n", "quiet")


@pytest.mark.parametrize(("limits", "field"), [
    ({"checkpoint_signal": "SIGBOGUS"}, "checkpoint_signal"),
    ({"checkpoint_signal": "SIGKILL"}, "checkpoint_signal"),
    ({"checkpoint_notice": -5}, "checkpoint_notice"),
    ({"checkpoint_notice": "-1m"}, "checkpoint_notice"),
])
def test_bad_notice_settings_are_refused(yard: Yard, limits: dict[str, object],
                                         field: str) -> None:
    path = yard.write_job("bad", {"name": "bad", "command": "true", "limits": limits})
    result = yard.cli("job", "create", "-f", str(path), "-c", "nowhere")
    assert result.rc == 2, str(result)
    assert f"limits.{field}" in result.stdout + result.stderr, str(result)
    resp = yard.http.post("/workspaces/default/jobs", json={
        "spec": {"command": "true", "limits": limits}, "cluster": "nowhere", "name": "bad"})
    assert resp.status_code == 422, resp.text
    assert field in resp.text, resp.text



GANG = """\
import os, signal, time
import batchyard
signal.signal(signal.SIGUSR1, lambda *_: None)
rank = os.environ["RANK"]
print(f"rank {rank} up", flush=True)
while not batchyard.should_checkpoint():
    time.sleep(0.1)
print(f"rank {rank} told", flush=True)
if rank == "0":
    time.sleep(1.0)
    batchyard.checkpoint_saved(5)
time.sleep(600)
"""


def test_rank_0_saving_ends_the_notice_on_every_node(yard: Yard) -> None:
    """Only rank 0 saves; the other node's launcher hears of it through the server and
    stops its rank too, long before the notice is over."""
    yard.ok("cluster", "create", "-n", "spot3", "-s", "Standard_D2_v2", "-t", "2",
            "--vm-priority", "lowpriority", "--provisioning-delay", "1")
    yard.wait_cluster("spot3", 2)
    path = yard.write_job("gang", {
        "name": "gang", "nodes": 2, "code": ".", "command": "python gang.py",
        "limits": {"checkpoint_notice": f"{NOTICE}s", "max_retries": 0}}, {"gang.py": GANG})
    yard.ok("job", "create", "-f", str(path), "-c", "spot3")
    yard.wait_job("gang", ("running",), timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline:
        if yard.ok("job", "logs", "-n", "gang").stdout.count(" up") >= 2:
            break
        time.sleep(0.3)
    asked = time.time()
    yard.ok("cluster", "node", "preempt", "-c", "spot3", "-n", "spot3-1")
    deadline = time.time() + 60
    while time.time() < deadline:
        job = yard.job("gang")
        if job["attempts"] and job["attempts"][0]["state"] == "preempted":
            break
        time.sleep(0.3)
    first = job["attempts"][0]
    assert first["state"] == "preempted", job
    assert first["ended_at"] - asked < NOTICE - 5, (first, asked)
    assert "after its last checkpoint (step 5)" in (first["message"] or ""), first
    log1 = yard.ok("job", "logs", "-n", "gang", "--attempt", "1").stdout
    assert "rank 0 told" in log1 and "rank 1 told" in log1, log1
    yard.ok("job", "terminate", "-n", "gang")
