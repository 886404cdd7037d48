"""Jobs cannot escape (issue 32), on the local backend: a job of user alice tries every item of
the issue's list, as an attacker would, and each fails while its own checkpoint, outputs,
metrics and logs still work; a job of user bob on the same node cannot read what alice's job
left (its directories, its /tmp, its /dev/shm); a fork bomb and an output past its limit fail
their jobs with their causes and leave the node and the server healthy; paths that reach the
server's home are refused at submit in every job format (exit 2, naming the field) and again
on the node; root runs only on a cluster that allows it, with / still read-only.

Submitters: a job's ``created_by`` is set in the jobs table (the column the identities work
fills from the caller) while the job waits behind a gate job, so the plan its node gets names
the user."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml

import strictkit
from hostilekit import ATTACK, PEEK, assert_host_untouched, assert_refused, host_files, report_of
from yardkit import Yard, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              strictkit.requires(os.geteuid() != 0, "root only: jobs drop to a uid")]
CLUSTER = "hostile"
JOBS = "/workspaces/default/experiments/default/jobs"


@pytest.fixture(scope="module")
def site(yard: Yard) -> Yard:
    yard.ok("cluster", "create", "-n", CLUSTER, "-s", "Standard_D2_v2", "-t", "1")
    yard.ok("cluster", "create", "-n", "gate", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster(CLUSTER, 1)
    yard.wait_cluster("gate", 1)
    return yard


def submit_as(yard: Yard, user: str, name: str, spec: dict[str, Any],
              files: dict[str, str] | None = None) -> None:
    """Submit ``name`` as ``user``: held behind a gate job until its submitter is set."""
    gate = f"gate-{name}"
    path = yard.write_job(gate, {"name": gate, "command": "sleep 600"})
    yard.ok("job", "create", "-f", str(path), "-c", "gate")
    path = yard.write_job(name, {"name": name, **spec,
                                 "depends_on": [{"job": gate, "condition": "finished"}]},
                          files=files)
    yard.ok("job", "create", "-f", str(path), "-c", CLUSTER)
    url = yard.env.get("BATCHYARD_DB_URL") or f"sqlite:///{yard.home / 'batchyard.db'}"
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            done = conn.execute(sa.text("UPDATE jobs SET created_by = :u WHERE name = :n"),
                                {"u": user, "n": name})
            assert done.rowcount == 1
    finally:
        engine.dispose()
    yard.ok("job", "terminate", "-n", gate)


def finished(yard: Yard, name: str, timeout: float = 120) -> dict[str, Any]:
    return yard.wait_job(name, timeout=timeout)


def launcher_log(yard: Yard, job: dict[str, Any]) -> str:
    return "\n".join(p.read_text() for d in yard.node_attempt_dirs(job)
                     for p in d.rglob("*-launcher.txt"))


def download(yard: Yard, name: str, path: str) -> httpx.Response:
    return yard.http.get(f"{JOBS}/{name}/files/content", params={"path": path})


@pytest.fixture(scope="module")
def alice(site: Yard) -> Iterator[dict[str, Any]]:
    """Alice's hostile job, once: its job, report, launcher log, and the host before it."""
    before = host_files()
    cred = next((site.home / "clusters").rglob("tickets"), site.home / "clusters")
    submit_as(site, "alice", "attack", {
        "code": ".", "command": "python attack.py", "distribution": {"type": "custom"},
        "outputs": {"OUT": {}, "EVIL": {}},
        "env": {"ATTACK_HOME": str(site.home), "NODE_CRED": str(cred / "x.json")}},
        files={"attack.py": ATTACK})
    job = finished(site, "attack")
    logs = site.cli("job", "logs", "-n", "attack").stdout
    assert job["state"] == "succeeded", (job, logs)
    dest = site.work / "alice"
    site.ok("job", "file", "download", "-n", "attack", "--path", "outputs/OUT",
            "--dest", str(dest))
    yield {"job": job, "report": report_of(dest / "outputs" / "OUT"), "logs": logs,
           "launcher": launcher_log(site, job), "before": before, "dest": dest}


def test_every_try_of_the_attacker_fails(alice: dict[str, Any]) -> None:
    assert_refused(alice["report"])
    assert_host_untouched(alice["before"])


def test_it_runs_as_an_unprivileged_uid_of_its_submitter(site: Yard,
                                                         alice: dict[str, Any]) -> None:
    report = alice["report"]
    assert report["uid"] >= 1_600_000_000 and report["user"] == "by-alice", report
    assert "sandbox (ns, as by-alice (uid " in alice["launcher"], alice["launcher"]
    job_dir = Path(report["job dir"])
    for own in (job_dir / "shared", Path(report["work dir"])):
        st = own.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (report["uid"], 0o700), own


def test_its_own_checkpoint_outputs_metrics_and_logs_work(site: Yard,
                                                          alice: dict[str, Any]) -> None:
    node_dir = site.node_attempt_dirs(alice["job"])[0]
    assert (node_dir.parent / "checkpoints" / "step.txt").read_text() == "7"
    assert (alice["dest"] / "outputs" / "OUT" / "model.txt").read_text() == "weights\n"
    metrics = site.http.get(f"{JOBS}/attack/metrics")
    assert metrics.status_code == 200 and "steps" in metrics.text, metrics.text
    assert "hostile job done" in alice["logs"]


def test_links_out_of_an_output_are_not_uploaded(site: Yard, alice: dict[str, Any]) -> None:
    token = site.token
    for name in ("tok", "db", "shadow", "cred"):
        resp = download(site, "attack", f"outputs/OUT/{name}")
        assert resp.status_code == 404, (name, resp.text[:200])
        assert token not in resp.text
        assert f"{name} -> " in alice["launcher"], alice["launcher"]
    listed = site.js("job", "file", "list", "-n", "attack")
    names = {f["path"] for f in (listed["files"] if isinstance(listed, dict) else listed)}
    assert not any(p.startswith("outputs/EVIL/") for p in names), names
    assert "not uploaded: output OUT: tok -> " in alice["launcher"]


def test_another_users_job_cannot_read_what_it_left(site: Yard, alice: dict[str, Any]) -> None:
    report = alice["report"]
    left = [os.path.join(report["job dir"], "shared", "left-behind.txt"),
            os.path.join(report["work dir"], "left-behind.txt"),
            "/tmp/left-behind.txt", "/dev/shm/left-behind.txt"]
    assert Path(left[0]).read_text() == "pwned\n"  # (it is there, on the node)
    for user in ("bob", "alice"):  # another user, and the same user's next job
        name = f"peek-{user}"
        submit_as(site, user, name, {"code": ".", "command": "python peek.py",
                                     "outputs": {"OUT": {}}, "env": {"PEEK": "\n".join(left)}},
                  files={"peek.py": PEEK})
        job = finished(site, name)
        assert job["state"] == "succeeded", job
        dest = site.work / name
        site.ok("job", "file", "download", "-n", name, "--path", "outputs/OUT",
                "--dest", str(dest))
        peek = report_of(dest / "outputs" / "OUT")
        read = {k: v for k, v in peek.items() if str(v).startswith("READ")}
        assert read == {}, peek
        if user == "bob":
            assert peek["uid"] != report["uid"] and peek["uid"] >= 1_600_000_000, peek


def test_a_fork_bomb_fails_its_job_and_the_node_stays(site: Yard) -> None:
    bomb = "import os, time\nfor _ in range(10000):\n    if os.fork() == 0:\n" \
           "        time.sleep(60)\n        os._exit(0)\n"
    submit_as(site, "alice", "bomb", {"code": ".", "command": "python bomb.py",
                                      "limits": {"max_pids": 64}}, files={"bomb.py": bomb})
    job = finished(site, "bomb", timeout=180)
    assert job["state"] == "failed", job
    assert (job.get("error") or {}).get("cause") == "process limit", job
    assert "limit of 64 processes" in job["message"], job
    after = site.write_job("after-bomb", {"name": "after-bomb", "command": "echo alive"})
    site.ok("job", "create", "-f", str(after), "-c", CLUSTER)
    assert finished(site, "after-bomb")["state"] == "succeeded"
    assert site.http.get("/workspaces").status_code == 200


def test_output_past_its_limit_fails_the_job(site: Yard) -> None:
    write = 'head -c 5000000 /dev/zero > "$BATCHYARD_OUTPUT_OUT/big"; sleep 5'
    submit_as(site, "alice", "fat", {"command": write, "outputs": {"OUT": {}},
                                     "limits": {"max_output": "1M"}})
    job = finished(site, "fat")
    assert job["state"] == "failed", job
    assert (job.get("error") or {}).get("cause") == "output limit", job
    assert "limit of 1M" in job["message"], job


def _refused(run: Any, field: str) -> None:
    assert run.rc == 2, str(run)
    assert field in run.stderr and "Traceback" not in run.stderr, str(run)


def test_paths_into_the_servers_home_are_refused_at_submit(site: Yard) -> None:
    token = site.home / "token"
    folder = site.work / "jobs" / "refused"
    folder.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(token, folder)  # ../../../home0/token, as the job file names it
    cases = {
        "inputs.T1.path": {"command": "cat $BATCHYARD_INPUT_T1", "inputs": {"T1": {
            "path": str(token)}}},
        "inputs.T2.path": {"command": "x", "inputs": {"T2": {"path": rel, "mode": "download"}}},
        "mounts[0].source": {"command": "x", "mounts": [{"kind": "local",
                                                         "relative_path": "m",
                                                         "source": str(site.home)}]},
        "code": {"command": "x", "code": str(site.home)},
    }
    for field, spec in cases.items():
        path = folder / f"{field.replace('[', '_').replace(']', '_')}.yaml"
        path.write_text(yaml.safe_dump(spec))
        _refused(site.cli("job", "create", "-f", str(path), "-c", CLUSTER, "-n", "r"), field)
    batchai = folder / "job.json"
    batchai.write_text(json.dumps({"properties": {
        "nodeCount": 1, "customToolkitSettings": {"commandLine": "x"},
        "inputDirectories": [{"id": "DATA", "path": str(token)}]}}))
    _refused(site.cli("job", "create", "-f", str(batchai), "-c", CLUSTER, "-n", "r"),
             "inputs.DATA.path")
    aml = folder / "aml.yml"
    aml.write_text(yaml.safe_dump({
        "$schema": "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json",
        "command": "cat ${{inputs.data}}", "environment": "azureml:x:1",
        "inputs": {"data": {"type": "uri_file", "path": str(token)}}}))
    _refused(site.cli("job", "create", "-f", str(aml), "-c", CLUSTER, "-n", "r"),
             "inputs.DATA.path")
    sweep = folder / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "command": "x ${{search_space.lr}}", "inputs": {"T1": {"path": str(token)}},
        "sweep": {"search_space": {"lr": {"type": "choice", "values": [1, 2]}},
                  "sampling": {"type": "grid"},
                  "objective": {"primary_metric": "loss", "goal": "minimize"},
                  "limits": {"max_total_trials": 2}}}))
    _refused(site.cli("sweep", "create", "-f", str(sweep), "-c", CLUSTER, "-n", "rs"),
             "inputs.T1.path")
    resp = site.http.post("/workspaces/default/jobs", json={
        "spec": {"command": "x", "inputs": {"T1": {"path": str(token)}}}, "cluster": CLUSTER})
    assert resp.status_code == 422 and "inputs.T1.path" in resp.text, resp.text
    assert site.http.get("/workspaces").status_code == 200


def test_a_datastore_path_out_of_its_folder_or_on_the_home_is_refused(site: Yard) -> None:
    made = site.http.post("/workspaces/default/datastores", json={
        "name": "evil", "kind": "local", "path": str(site.home)})
    assert made.status_code == 422 and "path" in made.text, made.text
    store = site.work / "store"
    store.mkdir()
    (store / "data.txt").write_text("fine")
    (store / "tok").symlink_to(site.home / "token")
    site.ok("datastore", "register", "plain", "--kind", "local", "--path", str(store))
    for ref in ("datastore://plain/tok", "datastore://plain/../home/token"):
        spec = {"command": "x", "inputs": {"T1": {"path": ref, "mode": "download"}}}
        path = site.write_job("ds", {"name": "ds", **spec})
        _refused(site.cli("job", "create", "-f", str(path), "-c", CLUSTER), "inputs.T1.path")
    got = site.http.get("/workspaces/default/datastores/plain/files/tok")
    assert got.status_code == 404 and site.token not in got.text, got.text


def test_a_path_that_leads_home_only_on_the_node_is_refused_there(site: Yard) -> None:
    """The submit-time check passed (nothing there yet); the node resolves the link."""
    later = site.work / "later"
    path = site.write_job("late", {"name": "late", "command": "cat $BATCHYARD_INPUT_T1",
                                   "inputs": {"T1": {"path": str(later)}}})
    gate = site.write_job("gate-late", {"name": "gate-late", "command": "sleep 600"})
    site.ok("job", "create", "-f", str(gate), "-c", "gate")
    spec = yaml.safe_load(path.read_text())
    spec["depends_on"] = [{"job": "gate-late", "condition": "finished"}]
    path.write_text(yaml.safe_dump(spec))
    site.ok("job", "create", "-f", str(path), "-c", CLUSTER)
    later.symlink_to(site.home / "token")
    site.ok("job", "terminate", "-n", "gate-late")
    job = finished(site, "late")
    assert job["state"] == "failed", job
    assert "inputs.T1.path" in job["message"], job
    logs = site.cli("job", "logs", "-n", "late").stdout
    assert site.token not in logs and site.token not in json.dumps(job)


def test_root_only_on_a_cluster_that_allows_it(site: Yard) -> None:
    site.ok("cluster", "create", "-n", "rootok", "-s", "Standard_D2_v2", "-t", "1",
            "--allow-root-jobs")
    shown = site.js("cluster", "show", "rootok")
    assert shown["allow_root_jobs"] is True, shown
    assert "root (--allow-root-jobs)" in site.ok("cluster", "show", "rootok").stdout
    assert site.js("cluster", "show", CLUSTER)["allow_root_jobs"] is False
    site.wait_cluster("rootok", 1)
    probe = ('id -u; touch /etc/x 2>&1; touch /root/x 2>&1; touch /usr/local/bin/x 2>&1; '
             'touch /tmp/x && echo tmp-ok')
    path = site.write_job("rooted", {"name": "rooted", "command": probe})
    site.ok("job", "create", "-f", str(path), "-c", "rootok")
    job = finished(site, "rooted")
    logs = site.cli("job", "logs", "-n", "rooted").stdout
    assert job["state"] == "succeeded", (job, logs)
    lines = [line.split("] ", 1)[-1] for line in logs.splitlines()]
    assert "0" in lines, logs
    assert logs.count("Read-only file system") == 3 and "tmp-ok" in logs, logs
    assert not Path("/etc/x").exists() and not Path("/root/x").exists()


def test_the_node_and_server_are_healthy_after_all(site: Yard) -> None:
    path = site.write_job("last", {"name": "last", "command": "echo still-fine"})
    site.ok("job", "create", "-f", str(path), "-c", CLUSTER)
    assert finished(site, "last")["state"] == "succeeded"
    leftover = list(Path("/sys/fs/cgroup/pids/batchyard").glob("*")) \
        if Path("/sys/fs/cgroup/pids/batchyard").is_dir() else []
    uuids = {a["uuid"] for name in ("attack", "bomb", "fat", "last")
             for a in site.job(name)["attempts"]}
    wait_until(lambda: not [p for p in leftover if any(u in p.name for u in uuids)
                            and p.exists()], 30, what="the jobs' cgroups to go")
