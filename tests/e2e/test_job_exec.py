"""`batchyard job exec` and `limits.keep_alive_on_failure` on a real server with real 2-node
jobs: an interactive shell driven through a pty (raw terminal, window size, job env and
directories, exit code), a plain command's streams and exit code, bad input, a job token that
tries another job, and a failed gang whose nodes stay held (another job waits) for exec, then
are freed; `cluster node exec -it` on a local node."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from urllib.parse import urlencode

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from ptykit import Pty
from yardkit import Yard, wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def job_spec(name: str, command: str, **limits: object) -> dict:
    return {"name": name, "nodes": 2, "command": command,
            "distribution": {"type": "pytorch", "processes_per_node": 1},
            "limits": {"grace_period": 2, **limits}}


def submit(yard: Yard, cluster: str, name: str, command: str, **limits: object) -> None:
    yard.ok("job", "create", "-f", str(yard.write_job(name, job_spec(name, command, **limits))),
            "-c", cluster)


@pytest.fixture(scope="module")
def live(yard: Yard, cluster2: str) -> str:
    """A running 2-node job whose ranks leave a file in their node's job temp dir."""
    submit(yard, cluster2, "live", 'echo "node $NODE_RANK was here" > '
           '"$AZ_BATCHAI_JOB_TEMP/mark"; sleep 600')
    yard.wait_job("live", ("running",), timeout=60)
    return "live"


def test_interactive_shell_on_node_1(yard: Yard, live: str) -> None:
    term = Pty.cli(yard, "job", "exec", "-n", live, "--node", "1", "-it")
    term.expect(r"[#$] $")  # the remote shell's prompt
    term.send('echo "N=$NODE_RANK W=$WORLD_SIZE M=${MASTER_ADDR:+set} J=$AZ_BATCHAI_JOB_NAME"'
              '; echo "D=$(pwd) T=$(cat "$AZ_BATCHAI_JOB_TEMP/mark")"; stty size; '
              'echo "TTY=$([ -t 0 ] && echo yes)"; echo "DIR=$BATCHYARD_WORK_DIR"\r')
    term.expect(r"N=1 W=2 M=set J=live")
    here = term.expect(r"D=(\S+) T=node 1 was here").group(1).decode()
    term.expect(r"\b30 100\b")  # this terminal's size reached the remote pty
    term.expect(r"TTY=yes")
    assert term.expect(r"DIR=(/\S+)").group(1).decode() == here  # cwd: the job's work dir
    term.send("exit 7\r")
    assert term.wait() == 7
    events = [e["message"] or "" for e in yard.job(live)["events"]]
    assert any("exec on node" in m and "interactive shell" in m for m in events), events
    assert any("ended: exit code 7" in m for m in events), events


def test_plain_command_streams_and_exit_code(yard: Yard, live: str) -> None:
    run = yard.cli("job", "exec", live, "--node", "1", "--",
                   "sh", "-c", 'echo "out $NODE_RANK"; echo "err $RANK_NONE" >&2; exit 3')
    assert run.rc == 3, str(run)
    assert run.stdout == "out 1\n" and run.stderr == "err \n", str(run)
    piped = yard.cli("job", "exec", "-n", live, "--", "cat", "-")  # no -i: stdin is empty
    assert piped.rc == 0 and piped.stdout == "", str(piped)


def test_stdin_and_output_in_bulk_arrive_whole(yard: Yard, live: str) -> None:
    data = os.urandom(3 << 20)
    run = subprocess.run([sys.executable, "-m", "batchyard.cli.main", "job", "exec", "-i",
                          live, "--node", "1", "--", "sh", "-c", "sha256sum; head -c 5000000 "
                          "/dev/zero | tr '\\0' x"], input=data, env=yard.env,
                         capture_output=True, timeout=120, cwd=yard.work)
    assert run.returncode == 0, run.stderr
    digest, rest = run.stdout.split(b"\n", 1)
    assert digest.split()[0].decode() == hashlib.sha256(data).hexdigest()
    assert rest == b"x" * 5000000


@pytest.mark.parametrize(("args", "named"), [
    (("--node", "2", "--", "true"), "--node 2"),
    (("--", ), "give a command"),
    (("--node", "-1", "--", "true"), "--node -1"),
])
def test_bad_input_exits_2(yard: Yard, live: str, args: tuple[str, ...], named: str) -> None:
    run = yard.cli("job", "exec", "-n", live, *args)
    assert run.rc == 2, str(run)
    assert named in run.stderr and "Traceback" not in run.stderr, str(run)


def test_job_token_reaches_its_own_job_only(yard: Yard, cluster2: str, live: str) -> None:
    yard.ok("cluster", "create", "-n", "side", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("side", 1)
    yard.ok("job", "create", "-f", str(yard.write_job("other", {
        "name": "other", "nodes": 1, "command": "sleep 600"})), "-c", "side")
    yard.wait_job("other", ("running",), timeout=60)
    token = yard.ok("job", "exec", live, "--", "printenv", "BATCHYARD_TOKEN").stdout.strip()
    assert token.startswith("job.")
    own = ws_exec(yard, token, live, ["echo", "mine"])
    assert own == (b"\x01mine\n", 0)
    before = len(yard.job("other")["events"])
    with pytest.raises(InvalidStatus) as refused:
        ws_exec(yard, token, "other", ["touch", "/tmp/should-not-exist"])
    assert refused.value.response.status_code == 403
    assert b"its own job" in refused.value.response.body
    assert len(yard.job("other")["events"]) == before  # nothing ran, nothing recorded
    yard.ok("job", "terminate", "other")


def ws_exec(yard: Yard, token: str, job: str, argv: list[str]) -> tuple[bytes, int]:
    """The exec socket as any client sees it: output frames, then the exit code."""
    query = urlencode([("argv", a) for a in argv])
    url = (yard.url.replace("http", "ws", 1)
           + f"/api/v1/workspaces/default/experiments/default/jobs/{job}/exec?{query}")
    out, code = b"", -1
    with connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        ws.send(json.dumps({"eof": True}))
        for message in ws:
            if isinstance(message, bytes):
                out += message
            else:
                code = json.loads(message)["exit_code"]
    return out, code


def test_keep_alive_holds_nodes_for_exec_then_frees_them(yard: Yard, cluster2: str,
                                                         live: str) -> None:
    yard.ok("job", "terminate", live)  # its 2 nodes are needed now
    yard.wait_job(live, timeout=60)
    submit(yard, cluster2, "kept", 'echo "left by $NODE_RANK" > "$AZ_BATCHAI_JOB_TEMP/left"; '
           'if [ "$NODE_RANK" = 1 ]; then sleep 1; exit 5; fi; sleep 600',
           keep_alive_on_failure="25s")
    failed = yard.wait_job("kept", timeout=90)
    assert failed["state"] == "failed" and failed["exit_code"] == 5, failed
    shown = yard.job("kept")
    assert "nodes held until" in (shown["pending_reason"] or ""), shown
    assert len(shown["assigned_nodes"]) == 2, shown
    waited = yard.cli("job", "wait", "kept")  # says so where a user waits for the job
    assert waited.rc == 5 and "nodes held until" in waited.stdout + waited.stderr, str(waited)
    submit(yard, cluster2, "waiter", "true")
    run = yard.cli("job", "exec", "kept", "--node", "1", "--", "cat",
                   "$AZ_BATCHAI_JOB_TEMP/left")  # no shell: the literal name
    assert run.rc == 1, str(run)
    run = yard.cli("job", "exec", "kept", "--node", "1", "--", "sh", "-c",
                   'cat "$AZ_BATCHAI_JOB_TEMP/left"; ls -d "$PWD"')
    assert run.rc == 0 and run.stdout.startswith("left by 1\n"), str(run)
    assert yard.job("waiter")["state"] == "queued"  # the held nodes are not given away
    state = yard.js("job", "show", "kept")
    assert "nodes held until" in (state["pending_reason"] or "")
    finished = yard.wait_job("waiter", timeout=120)
    assert finished["state"] == "succeeded", finished
    kept = yard.job("kept")
    assert kept["pending_reason"] is None and kept["assigned_nodes"] == []
    messages = [e["message"] or "" for e in kept["events"]]
    assert any("keep-alive time is up" in m for m in messages), messages
    held_at = next(e["ts"] for e in kept["events"] if "nodes held until" in (e["message"] or ""))
    freed_at = next(e["ts"] for e in kept["events"] if "time is up" in (e["message"] or ""))
    assert 24 <= freed_at - held_at <= 60, (held_at, freed_at)
    late = yard.cli("job", "exec", "kept", "--", "true")
    assert late.rc == 2 and "keep_alive_on_failure" in late.stderr, str(late)
    yard.assert_no_process_left(kept, timeout=20)


def test_terminate_ends_keep_alive_early(yard: Yard, cluster2: str) -> None:
    submit(yard, cluster2, "kept-long", "exit 4", keep_alive_on_failure="10m")
    yard.wait_job("kept-long", timeout=90)
    assert "nodes held until" in (yard.job("kept-long")["pending_reason"] or "")
    run = yard.ok("job", "terminate", "kept-long")
    assert "released" in run.stdout, str(run)
    wait_until(lambda: yard.job("kept-long")["assigned_nodes"] == [], 30,
               what="the held nodes to be released")
    yard.assert_no_process_left(yard.job("kept-long"), timeout=20)


def test_cluster_node_exec_it_on_a_local_node(yard: Yard, cluster2: str) -> None:
    node = yard.js("cluster", "node", "list", "-c", cluster2)[0]["name"]
    term = Pty.cli(yard, "cluster", "node", "exec", "-c", cluster2, "-n", node, "-it")
    term.expect(r"[#$] $")
    term.send('echo "NODE=$BATCHYARD_NODE_NAME TTY=$([ -t 0 ] && echo yes)"; exit 3\r')
    term.expect(rf"NODE={re.escape(node)} TTY=yes")
    assert term.wait() == 3
