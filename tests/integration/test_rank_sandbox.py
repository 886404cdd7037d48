"""Job code cannot read the server's secrets (issue 16, item 7). A job once read
``$BATCHYARD_HOME/token`` and listed another workspace's jobs with it. Two workspaces, a job
in each; the attacker's rank, told the real home, tries exactly that and everything around
it: the admin token (directly and through ``/proc/PID/root`` of every process), the database,
the other job's node dir and the server's copies of its logs, its own launcher's ticket and
the node credential, other processes' environments (job tokens). Nothing of it may work;
and the job's own directories, outputs, checkpoints and metrics still do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(240)

ATTACK = r'''
import json, os, sys, urllib.request

home = os.environ["ATTACK_HOME"]
found = {}

def grab(what, path):
    try:
        with open(path, "rb") as fh:
            found[what] = fh.read(4096).decode(errors="replace")
    except OSError:
        pass

grab("token", f"{home}/token")
grab("database", f"{home}/batchyard.db")
try:  # the tmpfs shows only the way to the job's own dirs
    found["home listing"] = [n for n in os.listdir(home) if n != "clusters"]
except OSError:
    pass
for top in (f"{home}/clusters", f"{home}/workspaces"):  # other jobs, tickets, log copies
    for folder, _dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(folder, name)
            if "/wsb/" in path or "/tickets/" in path or name.endswith((".db", "token")):
                grab(f"file {path}", path)
own_token = os.environ.get("BATCHYARD_TOKEN", "")
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    grab(f"/proc/{pid}/root token", f"/proc/{pid}/root{home}/token")
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        continue
    for item in env:
        key, _, value = item.decode(errors="replace").partition("=")
        if key in ("BATCHYARD_TOKEN", "BATCHYARD_HOME") and value != own_token \
                and value != home:
            found[f"/proc/{pid}/environ {key}"] = value
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    for arg in cmdline:
        if arg.endswith(b".json") and b"/tickets/" in arg:
            grab(f"ticket of {pid}", arg.decode())
api = os.environ["BATCHYARD_API"].rstrip("/")
for label, token in (("admin token", found.get("token", "").strip()),
                     ("job token", own_token)):
    if not token:
        continue
    req = urllib.request.Request(f"{api}/api/v1/workspaces/wsb/experiments/default/jobs",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            found[f"listed wsb with the {label}"] = resp.read(2000).decode()
    except Exception:
        pass
# everything this job does see of its own: the test looks for the node's credential in it
seen = []
for top in {os.environ["BATCHYARD_JOB_DIR"], os.path.dirname(os.environ["BATCHYARD_JOB_DIR"]),
            os.getcwd(), os.environ["AZ_BATCHAI_JOB_TEMP"]}:
    for folder, _dirs, files in os.walk(top):
        for name in files:
            try:
                with open(os.path.join(folder, name), "rb") as fh:
                    seen.append(fh.read(1 << 20).decode(errors="replace"))
            except OSError:
                pass
out = os.environ["BATCHYARD_OUTPUT_LOOT"]
with open(os.path.join(out, "found.json"), "w") as fh:
    json.dump(found, fh)
with open(os.path.join(out, "seen.txt"), "w") as fh:
    fh.write("\n".join(seen))
# its own things still work
ckpt = os.path.join(os.environ["BATCHYARD_CHECKPOINT_DIR"], "step.txt")
with open(ckpt, "w") as fh:
    fh.write("7")
import batchyard
batchyard.log_metric("steps", 7.0, step=1)
print("attack done:", sorted(found))
'''


def _wait_running(yard: Yard, name: str, ws: str) -> dict:
    return wait_until(lambda: (lambda j: j if j["state"] == "running" and yard.node_reports(j)
                               else None)(yard.job(name, workspace=ws)), 90,
                      what=f"job {name} running")


@pytest.fixture(scope="module")
def attack(yard: Yard) -> dict:
    """The scenario, once: what the attacker found, saw, and its job."""
    for ws, cluster in (("wsa", "ca"), ("wsb", "cb")):
        yard.ok("workspace", "create", "-n", ws)
        yard.ok("cluster", "create", "-n", cluster, "-w", ws, "-s", "Standard_D2_v2", "-t", "1")
        yard.wait_cluster(cluster, 1, workspace=ws, timeout=60)
    go = yard.work / "victim.go"
    victim = yard.write_job("victim", {
        "name": "victim", "command": 'echo victim-secret-log-line; '
        'until [ -e "$GO" ]; do sleep 0.1; done', "env": {"GO": str(go)},
        "secrets": {"VICTIM_SECRET": "victim-hush-42"}})
    yard.ok("job", "create", "-f", str(victim), "-c", "cb", "-w", "wsb")
    victim_job = _wait_running(yard, "victim", "wsb")
    assert yard.node_attempt_dirs(victim_job)  # the victim's node dir exists on disk
    wait_until(lambda: any(yard.attempt_dir(yard.job("victim", workspace="wsb")).rglob(
        "*.txt")), 60, what="the server's copy of the victim's log")
    attacker = yard.write_job("attacker", {
        "name": "attacker", "code": ".", "command": "python attack.py",
        "distribution": {"type": "custom"},  # it gets the MPI relay agent too
        "outputs": {"LOOT": {}}, "env": {"ATTACK_HOME": str(yard.home)}},
        files={"attack.py": ATTACK})
    run = yard.cli("job", "create", "-f", str(attacker), "-c", "ca", "-w", "wsa", "--wait",
                   timeout=180)
    go.touch()
    job = yard.job("attacker", workspace="wsa")
    logs = yard.cli("job", "logs", "-n", "attacker", "-w", "wsa").stdout
    assert job["state"] == "succeeded", (str(run), job, logs)
    dest = yard.work / "loot"
    yard.ok("job", "file", "download", "-n", "attacker", "-w", "wsa", "--path", "outputs/LOOT",
            "--dest", str(dest))
    found = json.loads((dest / "outputs" / "LOOT" / "found.json").read_text())
    found = {k: v for k, v in found.items() if v}
    victim_done = yard.wait_job("victim", workspace="wsb", timeout=60)
    assert victim_done["state"] == "succeeded", victim_done
    return {"found": found, "seen": (dest / "outputs" / "LOOT" / "seen.txt").read_text(),
            "job": job, "logs": logs}


def test_a_rank_cannot_read_the_servers_files_or_other_jobs(attack: dict) -> None:
    """The issue's attack: the token, the database, other jobs' and the server's files, the
    other workspace's jobs over the API."""
    found = {k: v for k, v in attack["found"].items() if not k.startswith("/proc/")}
    assert found == {}, f"the rank got at: {json.dumps(found, indent=1)[:3000]}"


def test_a_rank_cannot_reach_them_through_proc(attack: dict) -> None:
    """Through ``/proc``: other processes' roots and environments (a PID namespace of the
    attempt's own on each machine, node/pidns.py, shows none but the job's)."""
    found = {k: v for k, v in attack["found"].items() if k.startswith("/proc/")}
    assert found == {}, f"the rank got at: {json.dumps(found, indent=1)[:3000]}"


def test_no_launcher_credential_is_visible_and_own_dirs_work(yard: Yard, attack: dict) -> None:
    job, logs, seen = attack["job"], attack["logs"], attack["seen"]
    admin = (yard.home / "token").read_text().strip()
    assert admin not in seen
    tickets = list((yard.home / "clusters").rglob("tickets/*.json"))
    credentials = [json.loads(t.read_text()).get("token") for t in tickets]
    node_dirs = yard.node_attempt_dirs(job)
    credentials += [json.loads(t.read_text()).get("token")
                    for t in node_dirs[0].rglob("*.json") if "ticket" in t.name]
    for credential in filter(None, credentials):
        assert credential not in seen
    # its own directories still work: checkpoint, output (downloaded above), metric, logs
    ckpt = Path(node_dirs[0]).parent / "checkpoints"
    assert any(p.read_text() == "7" for p in ckpt.rglob("step.txt")), ckpt
    metrics = yard.http.get("/workspaces/wsa/experiments/default/jobs/attacker/metrics")
    assert metrics.status_code == 200 and "steps" in metrics.text, metrics.text
    assert "attack done" in logs, logs
    launcher_log = "\n".join(p.read_text() for p in node_dirs[0].rglob("*-launcher.txt"))
    assert "sandbox (ns" in launcher_log, launcher_log
    assert "a PID namespace of this attempt's own" in launcher_log, launcher_log
