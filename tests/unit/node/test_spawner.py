"""The sandbox's fork server (node/spawner.py): a job process it forks is the launcher's
child (a subreaper's adopted one), runs in the attempt's PID namespace with its own stdout,
stderr, environment and directory, ends as the command did (exit code, signal), gets the
signals sent to it, and dies with the launcher. Each scenario runs in a process of its own
that plays the launcher (a child subreaper: pytest's process must not become one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import strictkit
from batchyard.node import pidns

LAUNCHER = r'''
import json, os, signal, sys, time, uuid
from batchyard.node import pidns, proctree
from batchyard.node.spawner import Spawner

assert proctree.become_subreaper()
keeper = pidns.Keeper(f"test-{uuid.uuid4()}", lambda _m: None)
why = keeper.start()
if why is not None:
    print(json.dumps({"skip": why}))
    sys.exit(0)
spec = {"hide": [], "binds": [], "ro_binds": [], "pidns": keeper.spec()}
out_dir = sys.argv[1]
spawner = Spawner("test-tag")
results = {}
for name, argv, kill in json.loads(sys.argv[2]):
    with open(f"{out_dir}/{name}.out", "ab") as out, open(f"{out_dir}/{name}.err", "ab") as err:
        pid = spawner.spawn(argv, {"PATH": os.environ["PATH"], "WHO": name}, out_dir,
                            out.fileno(), err.fileno(), spec)
    if kill:
        deadline = time.monotonic() + 10
        while pidns.forwarded(pid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(pid, kill)
    _, status = os.waitpid(pid, 0)  # a child of this process, as from Popen
    results[name] = proctree.exit_code(status)
spawner.close()
spawner.proc.wait(timeout=10)  # it ends at end-of-file
keeper.stop()
print(json.dumps(results))
'''


def _run(tmp_path: Path, cases: list[tuple[str, list[str], int]]) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", LAUNCHER, str(tmp_path), json.dumps(cases)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in result:
        strictkit.missing(f"no PID namespace here: {result['skip']}")
    return dict(result)


def test_job_processes_end_as_their_command_did(tmp_path: Path) -> None:
    codes = _run(tmp_path, [
        ("procs", ["sh", "-c", "ls /proc | grep -c '^[0-9]'"], 0),
        ("three", ["sh", "-c", "echo out $WHO $PWD; echo err >&2; exit 3"], 0),
        ("killed", ["sh", "-c", "kill -9 $$"], 0),
        ("segv", ["sh", "-c", "kill -SEGV $$"], 0),
        ("missing", ["no-such-command-here"], 0),
        ("termed", ["sh", "-c", "sleep 30"], 15),
        ("graceful", ["sh", "-c", "trap 'exit 7' TERM; sleep 30 & wait"], 15),
    ])
    assert codes == {"three": 3, "killed": 137, "segv": 139, "missing": 127, "termed": 143,
                     "graceful": 7, "procs": 0}
    assert (tmp_path / "three.out").read_text() == f"out three {tmp_path}\n"
    assert (tmp_path / "three.err").read_text() == "err\n"
    assert "no-such-command-here" in (tmp_path / "missing.err").read_text()
    # in the attempt's PID namespace: its PID 1, sh, ls and grep (and nothing else)
    assert int((tmp_path / "procs.out").read_text()) <= 4


def test_a_killed_launcher_leaves_no_job_process(tmp_path: Path) -> None:
    script = LAUNCHER.replace("_, status = os.waitpid(pid, 0)",
                              "print(json.dumps({'pid': pid}), flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path),
                             json.dumps([["sleeper", ["sleep", "60"], 0]])],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        if "skip" in line:
            strictkit.missing(f"no PID namespace here: {line['skip']}")
        forwarder = int(line["pid"])
        import time

        deadline = time.monotonic() + 10
        while (child := pidns.forwarded(forwarder)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{p}") and _not_zombie(p) for p in (forwarder, child)):
            assert time.monotonic() < deadline, "a job process outlived its launcher"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
