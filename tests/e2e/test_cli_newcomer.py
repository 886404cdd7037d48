"""A newcomer's pass over the CLI, against a real server and real jobs: waiting shows the
queue (state changes, pending reason) before the logs and ends with the job's final line;
Ctrl-C says how to re-attach; names work as a positional argument and are found across
experiments; one job file serves several runs (--set/--env/--nodes/...); bad input, missing
things and an unreachable server exit 2, 3 and 4; `server token` and `portal`; tables when
piped (one line per row, every column); JSON where data is printed."""

from __future__ import annotations

import getpass
import json
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from yardkit import Result, Yard, wait_until

pytestmark = pytest.mark.timeout(240)

SOLO = "solo"  # one node: the second job waits in the queue


def cli80(yard: Yard, *args: str, **env: str) -> Result:
    """The CLI as a pipe at 80 columns sees it."""
    proc = subprocess.run([sys.executable, "-m", "batchyard.cli.main", *args],
                          env={**yard.env, "COLUMNS": "80", **env}, cwd=str(yard.work),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)


def spec(command: str, nodes: int = 1, ppn: int = 1, **extra: Any) -> dict[str, Any]:
    return {"nodes": nodes, "distribution": {"type": "pytorch", "processes_per_node": ppn},
            "command": command, "limits": {"grace_period": 1}, **extra}


@pytest.fixture(scope="module")
def solo(yard: Yard) -> str:
    yard.ok("cluster", "create", SOLO, "-s", "Standard_D2_v2", "-t", "1",
            "--setup-task", "echo setup-done on $BATCHYARD_NODE_NAME")
    yard.wait_cluster(SOLO, 1)
    return SOLO


def test_create_wait_shows_the_queue_then_logs_then_final_line(yard: Yard, solo: str) -> None:
    blocker = yard.write_job("blocker", spec("sleep 3"))
    yard.ok("job", "create", "-f", str(blocker), "-n", "blocker", "-c", solo)
    yard.wait_job("blocker", ("running",), timeout=30)
    second = yard.write_job("second", spec('echo "second says hi from rank $RANK"; sleep 1.5'))
    run = yard.cli("job", "create", "-f", str(second), "-n", "second", "-c", solo, "--wait")
    assert run.rc == 0, str(run)
    err = run.stderr
    queued = err.index("job second: queued: waiting for")  # the pending reason, plain lines
    assert "job second: running on solo-0" in err[queued:], err
    out = run.stdout.splitlines()
    assert out[-1].startswith("job second succeeded in "), run.stdout
    assert "[solo-0/rank0] second says hi from rank 0" in out[:-1], run.stdout

    # `job wait` (by position) shows the queue too, then the final line on stdout
    yard.ok("job", "create", "-f", str(blocker), "-n", "blocker2", "-c", solo)
    yard.ok("job", "create", "-f", str(second), "-n", "third", "-c", solo)
    waited = yard.cli("job", "wait", "third")
    assert waited.rc == 0, str(waited)
    assert "job third: queued: " in waited.stderr, str(waited)
    assert waited.stdout.strip().startswith("job third succeeded"), str(waited)


def test_logs_follow_final_line_and_exit_codes_told_apart(yard: Yard, cluster2: str) -> None:
    failing = yard.write_job("code3", spec('echo "about to fail"; exit 3', nodes=2))
    yard.ok("job", "create", "-f", str(failing), "-n", "code3", "-c", cluster2)
    followed = yard.cli("job", "logs", "-f", "code3", "--exit-code")
    assert followed.rc == 3, str(followed)
    assert "about to fail" in followed.stdout
    assert followed.stderr.strip().splitlines()[-1].startswith(
        "job code3 failed with exit code 3"), str(followed)
    plain = yard.cli("job", "logs", "code3")  # without -f: the logs only, exit 0
    assert plain.rc == 0 and "about to fail" in plain.stdout and "failed" not in plain.stderr

    # a job's own exit code 3 and "not found" (3) are told apart by what is printed
    job_code = yard.cli("job", "wait", "code3")
    assert job_code.rc == 3 and job_code.stdout.startswith("job code3 failed with exit code 3")
    missing = yard.cli("job", "wait", "no-such-job")
    assert missing.rc == 3 and missing.stdout == "" and "error:" in missing.stderr
    as_json = yard.cli("job", "wait", "code3", "-o", "json")
    assert as_json.rc == 3 and as_json.json()["exit_code"] == 3


def _ctrl_c_as_at_a_terminal() -> None:
    """A command started in the background by a shell without job control (``cmd &`` in a
    script, as a CI runner may start the suite) inherits SIGINT ignored, and Python then
    never raises KeyboardInterrupt: the CLI here gets the disposition a terminal gives."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_says_how_to_reattach(yard: Yard, cluster2: str) -> None:
    yard.ok("experiment", "create", "ctrlc")
    job_file = yard.write_job("sleepy", spec('echo "up"; sleep 30'))
    proc = subprocess.Popen([sys.executable, "-m", "batchyard.cli.main", "job", "create", "-f",
                             str(job_file), "-n", "sleepy", "-e", "ctrlc", "-c", cluster2,
                             "--wait"], env=yard.env, cwd=str(yard.work),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, preexec_fn=_ctrl_c_as_at_a_terminal)
    try:
        def running() -> bool:
            resp = yard.http.get("/workspaces/default/experiments/ctrlc/jobs/sleepy")
            return resp.status_code == 200 and resp.json()["state"] == "running"

        wait_until(running, 30, what="job sleepy to run")
        time.sleep(1.0)  # following the logs by now
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err, err
    assert "batchyard job logs -f sleepy -e ctrlc" in err, err
    assert yard.job("sleepy", "ctrlc")["state"] == "running"  # Ctrl-C left it alone
    ended = yard.cli("job", "terminate", "sleepy")  # found without -e: the only one
    assert ended.rc == 0 and "job sleepy canceled after" in ended.stdout, str(ended)


def test_names_positional_and_found_across_experiments(yard: Yard, cluster2: str) -> None:
    for exp in ("alpha", "beta"):
        yard.ok("experiment", "create", exp)
    echo = yard.write_job("echo", spec('echo "from $BATCHYARD_JOB_NAME"', outputs={"OUT": {}}))
    yard.ok("job", "create", "-f", str(echo), "-n", "uniq", "-e", "alpha", "-c", cluster2)
    for exp in ("alpha", "beta"):
        yard.ok("job", "create", "-f", str(echo), "-n", "twin", "-e", exp, "-c", cluster2)
    yard.wait_job("uniq", experiment="alpha")
    for exp in ("alpha", "beta"):
        yard.wait_job("twin", experiment=exp)

    shown = yard.js("job", "show", "uniq")  # no -e: the one job of that name
    assert shown["experiment"] == "alpha" and shown["state"] == "succeeded"
    assert yard.js("job", "show", "-n", "uniq")["experiment"] == "alpha"  # -n still works
    assert "from uniq" in yard.ok("job", "logs", "uniq").stdout
    assert yard.ok("job", "wait", "uniq").stdout.startswith("job uniq succeeded")
    assert yard.js("job", "file", "list", "uniq")["attempt"] == 1
    assert yard.js("job", "metrics", "uniq") == []

    twin = yard.cli("job", "show", "twin")
    assert twin.rc == 2, str(twin)
    assert "alpha, beta" in twin.stderr and "-e" in twin.stderr
    assert yard.js("job", "show", "twin", "-e", "beta")["experiment"] == "beta"
    clash = yard.cli("job", "show", "uniq", "-n", "twin")
    assert clash.rc == 2 and "give one" in clash.stderr

    assert yard.js("cluster", "show", cluster2)["name"] == cluster2
    assert len(yard.js("cluster", "node", "list", cluster2)) == 2
    assert yard.js("experiment", "show", "alpha")["jobs"] == 2  # uniq and twin
    yard.ok("job", "delete", "uniq")
    assert yard.cli("job", "show", "uniq").rc == 3


def test_one_file_several_runs_with_overrides(yard: Yard, cluster2: str) -> None:
    job_file = yard.write_job("sweep", spec('echo "$GREETING rank $RANK of $WORLD_SIZE"',
                                            nodes=1, ppn=1, env={"GREETING": "hello"}))
    run = yard.cli("job", "create", "-f", str(job_file), "-n", "sweep-a", "-c", cluster2,
                   "--env", "GREETING=bonjour", "--nodes", "2", "--processes-per-node", "2",
                   "--priority", "high", "--tag", "lr=0.1", "--set", "limits.max_wall_clock=10m",
                   "--set", "env.EXTRA=1", "--wait")
    assert run.rc == 0, str(run)
    for rank in range(4):
        assert f"bonjour rank {rank} of 4" in run.stdout, str(run)
    shown = yard.js("job", "show", "sweep-a")
    assert (shown["nodes"], shown["processes_per_node"], shown["priority"]) == (2, 2, "high")
    assert shown["spec"]["tags"] == {"lr": "0.1"}
    assert shown["spec"]["env"] == {"GREETING": "bonjour", "EXTRA": "1"}
    assert shown["spec"]["limits"]["max_wall_clock"] == 600

    # the same file, unchanged, another run
    plain = yard.js("job", "create", "-f", str(job_file), "-n", "sweep-b", "-c", cluster2)
    assert yard.wait_job("sweep-b")["state"] == "succeeded"
    assert plain["nodes"] == 1 and plain["processes_per_node"] == 1

    dry = yard.ok("job", "create", "-f", str(job_file), "-n", "sweep-c", "-c", cluster2,
                  "--set", "distribution.processes_per_node=2", "--dry-run").stdout
    assert 'WORLD_SIZE="2"' in dry and 'WORLD_SIZE="4"' not in dry

    for bad, needle in ((["--set", "distribution.procs=2"], "distribution.procs"),
                        (["--set", "command.x=1"], "command.x"),
                        (["--env", "NOEQUALS"], "--env 'NOEQUALS'"),
                        (["--priority", "urgent"], "'low', 'normal' or 'high'"),
                        (["--nodes", "0"], "nodes")):
        res = yard.cli("job", "create", "-f", str(job_file), "-n", "sweep-bad", "-c", cluster2,
                       *bad)
        assert res.rc == 2, str(res)
        assert needle in res.stderr and "Traceback" not in res.stderr, str(res)
    assert "sweep-bad" not in [j["name"] for j in yard.js("job", "list")]


def test_bad_input_not_found_unreachable(yard: Yard, cluster2: str) -> None:
    bogus = yard.cli("job", "list", "--state", "bogus")
    assert bogus.rc == 2 and "queued, preparing, running" in bogus.stderr, str(bogus)
    job_file = yard.write_job("ign", spec("true"))
    ignored = yard.cli("job", "create", "-f", str(job_file), "-c", cluster2, "--ignore",
                       "no_such_property")
    assert ignored.rc == 2 and "--ignore no_such_property" in ignored.stderr, str(ignored)
    assert "nothing in job.yaml is refused" in ignored.stderr
    for args in (("job", "show", "nope"), ("cluster", "show", "nope"),
                 ("workspace", "show", "nope"), ("experiment", "show", "nope"),
                 ("job", "logs", "nope", "-e", "alpha-nope")):
        res = yard.cli(*args)
        assert res.rc == 3, str(res)
        assert "not found" in res.stderr and "Traceback" not in res.stderr
    down = cli80(yard, "job", "list", BATCHYARD_SERVER="http://127.0.0.1:9")
    assert down.rc == 4, str(down)
    assert "does not answer" in down.stderr and "Traceback" not in down.stderr


def test_server_token_and_portal(yard: Yard, cluster2: str, tmp_path_factory: Any) -> None:
    assert yard.ok("server", "token").stdout.strip() == yard.token
    assert yard.js("server", "token")["token"] == yard.token
    link = yard.ok("portal").stdout.strip()
    assert link == f"{yard.url}/login"
    assert "batchyard server token" in yard.ok("portal").stderr
    page = httpx.get(link, timeout=10)
    assert page.status_code == 200 and "batchyard server token" in page.text

    job_file = yard.write_job("portal-job", spec("true"))
    yard.ok("job", "create", "-f", str(job_file), "-n", "portal-job", "-c", cluster2)
    job_link = yard.js("portal", "--job", "portal-job")["url"]
    assert job_link == f"{yard.url}/login?next=/ws/default/exp/default/jobs/portal-job"
    assert "portal:" in yard.ok("server", "start").stdout  # already running: says where

    # the on-demand start names the portal too
    fresh = Yard(tmp_path_factory.mktemp("fresh-home"), tmp_path_factory.mktemp("fresh-work"))
    try:
        first = fresh.cli("job", "list")
        assert first.rc == 0, str(first)
        assert "Started a local batchyard server at" in first.stderr
        assert "portal: " in first.stderr and "batchyard server token" in first.stderr
        assert "no jobs" in first.stderr
        assert "Started" not in fresh.cli("job", "list").stderr  # once
    finally:
        fresh.stop()
    no_token = Yard(tmp_path_factory.mktemp("empty-home"), tmp_path_factory.mktemp("w"))
    missing = no_token.cli("server", "token")
    assert missing.rc == 3 and "server start" in missing.stderr


def test_tables_read_well_at_80_columns(yard: Yard, solo: str) -> None:
    long_name = "resnet50-lr0.001-bs256-warmup5-seed42"
    job_file = yard.write_job("long", spec('echo "done"'))
    yard.ok("experiment", "create", "tables")
    yard.ok("job", "create", "-f", str(job_file), "-n", long_name, "-e", "tables", "-c", solo)
    yard.wait_job(long_name, experiment="tables")
    listed = cli80(yard, "job", "list", "-e", "tables")
    assert listed.rc == 0, str(listed)
    # piped: one line per job with every column, as squeue prints (issue 33 #14)
    head, row = listed.stdout.splitlines()
    for column in ("Name", "Experiment", "Cluster", "State", "By", "Nodes", "Duration", "Exit"):
        assert column in head, listed.stdout
    by = getpass.getuser()  # the embedded default's admin: the OS user (issue 32)
    assert row.split()[:8] == [long_name, "tables", solo, "succeeded", by, "1", "x", "1"], row

    shown = cli80(yard, "cluster", "show", solo).stdout
    assert "{" not in shown and "manual, 1 node(s)" in shown and "1 idle" in shown
    exps = cli80(yard, "experiment", "list").stdout
    assert "1 succeeded" in exps and "{" not in exps
    job_show = cli80(yard, "job", "show", long_name).stdout
    assert "Nodes x processes" in job_show and "nodes_x" not in job_show

    files = cli80(yard, "job", "file", "list", long_name).stdout
    assert " B" in files and "stdouterr/solo-0-rank0.stdout.txt" in files  # human sizes

    empty = cli80(yard, "job", "list", "-e", "tables", "--state", "failed")
    assert empty.rc == 0 and empty.stdout == "" and "no jobs" in empty.stderr
    assert "no datastores" in cli80(yard, "datastore", "list").stderr

    # terminating a queued job reads naturally
    blocker = yard.write_job("blocker80", spec("sleep 5"))
    yard.ok("job", "create", "-f", str(blocker), "-n", "blocker80", "-c", solo)
    yard.ok("job", "create", "-f", str(blocker), "-n", "waiter80", "-c", solo)
    assert yard.job("waiter80")["state"] == "queued"
    ended = cli80(yard, "job", "terminate", "waiter80")
    assert ended.stdout.strip() == "job waiter80 canceled before it started (it was queued)"
    yard.ok("job", "terminate", "blocker80")


def test_json_where_data_is_printed(yard: Yard, solo: str) -> None:
    wait_until(lambda: yard.js("cluster", "file", "list", solo), 20, what="setup task files")
    files = yard.js("cluster", "file", "list", solo)
    stdout_file = next(f["path"] for f in files if f["path"].endswith("stdout.txt"))
    raw = yard.ok("cluster", "file", "show", solo, "-p", stdout_file).stdout
    assert "setup-done on solo-0" in raw
    data = yard.js("cluster", "file", "show", solo, "-p", stdout_file)
    assert data["content"] == raw and data["path"] == stdout_file
    assert json.loads(yard.ok("schema", "job").stdout)["type"] == "object"
    assert yard.js("version")["version"]
    assert yard.js("experiment", "list")
