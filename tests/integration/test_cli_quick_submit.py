"""`batchyard job create -f` of a native job through the quick path (cli/quick.py, issue 37)
against a real server: the same job is made, the same lines are printed, and every refusal
reads exactly as the whole CLI says it (same exit code, same stderr), with nothing made."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from yardkit import Yard

PROBE = r"""
import json, sys
whole, args = sys.argv[1] == "whole", sys.argv[2:]
sys.argv = ["batchyard", *args]
from batchyard.cli import quick
if whole:
    quick.run = lambda *a, **kw: None
rc = 0
try:
    quick.main()
except SystemExit as exc:
    rc = exc.code or 0
sys.stdout.flush()
heavy = [m for m in ("typer", "rich", "pydantic", "httpx") if m in sys.modules]
sys.stderr.write("\nMODULES " + json.dumps(heavy) + "\n")
sys.exit(rc)
"""


def _run(yard: Yard, whole: bool, *args: str) -> tuple[int, str, str, list[str]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, "whole" if whole else "quick", *args],
                          env=yard.env, cwd=str(yard.work), capture_output=True, text=True,
                          timeout=120)
    err, _, tail = proc.stderr.rpartition("\nMODULES ")
    return proc.returncode, proc.stdout, err, json.loads(tail)


@pytest.fixture(scope="module")
def held(yard: Yard) -> str:
    """A cluster whose one node takes an hour to come: jobs stay queued."""
    resp = yard.http.post("/workspaces/default/clusters", json={
        "name": "held", "vm_size": "Standard_D2_v2", "manual": {"target_node_count": 1},
        "provisioning_delay": 3600})
    assert resp.status_code == 201, resp.text
    return "held"


def _job_file(yard: Yard, name: str, text: str) -> str:
    path = yard.work / f"{name}.yaml"
    path.write_text(text)
    return str(path)


JOB = ("command: python train.py --lr 0.1\ncode: ./src\nnodes: 1\n"
       "env: {A: '1'}\ntags: {team: x}\nlimits: {max_wall_clock: 2h}\n")


def test_the_same_job_is_made_and_said(yard: Yard, held: str) -> None:
    (yard.work / "src").mkdir(exist_ok=True)
    (yard.work / "src" / "train.py").write_text("print('hi')\n")
    path = _job_file(yard, "job", JOB)
    rc, out, err, heavy = _run(yard, False, "job", "create", "-f", path, "-c", held, "-n",
                               "quick1")
    assert rc == 0, err
    assert heavy == [], heavy  # the quick path it was
    wrc, wout, werr, wheavy = _run(yard, True, "job", "create", "-f", path, "-c", held, "-n",
                                   "whole1")
    assert wrc == 0, werr
    assert "typer" in wheavy
    assert out.replace("quick1", "whole1") == wout
    assert err == werr == ""
    quick, whole = yard.job("quick1"), yard.job("whole1")
    assert quick["spec"]["code"].startswith("snapshot:")
    assert whole["spec"]["code"].startswith("snapshot:")  # (a pack's gzip header has a time)
    assert {**quick["spec"], "name": "-", "code": "-"} == {**whole["spec"], "name": "-",
                                                           "code": "-"}
    assert quick["source_format"] == whole["source_format"] == "native"

    rc, out, err, _ = _run(yard, False, "job", "create", "-f", path, "-c", held, "-n",
                           "quick2", "-o", "json", "-e", "exp2")
    wrc, wout, werr, _ = _run(yard, True, "job", "create", "-f", path, "-c", held, "-n",
                              "whole2", "-o", "json", "-e", "exp2")
    assert (rc, wrc) == (0, 0), (err, werr)
    got, want = json.loads(out), json.loads(wout)
    assert got["experiment"] == want["experiment"] == "exp2"
    assert set(got) == set(want)
    assert {k: v for k, v in got.items() if k not in ("name", "submitted_at", "id", "uuid")} \
        == {k: v for k, v in want.items() if k not in ("name", "submitted_at", "id", "uuid")}


@pytest.mark.parametrize("text, extra, word", [
    ("command: 'true'\nnodes: 0\n", (), "nodes"),                 # a bad field
    ("command: 'true'\nbogus: 1\n", (), "bogus"),                 # an unknown one
    ("command: 'true'\n", ("-c", "nosuch"), "nosuch"),            # no such cluster
    ("command: 'true'\n", ("-w", "nows"), "nows"),                # no such workspace
    ("command: 'true'\ncode: ./missing\n", (), "missing"),        # no such code folder
])
def test_a_refusal_reads_as_before(yard: Yard, held: str, text: str, extra: tuple[str, ...],
                                   word: str) -> None:
    path = _job_file(yard, "bad", text)
    args = ("job", "create", "-f", path, "-c", held, "-n", "refused", *extra)
    before = len(yard.js("job", "list", "--all"))
    quick = _run(yard, False, *args)
    whole = _run(yard, True, *args)
    assert quick[:3] == whole[:3]
    assert quick[0] in (2, 3), quick
    assert word in quick[2] and "Traceback" not in quick[2]
    assert len(yard.js("job", "list", "--all")) == before  # nothing made


def test_a_name_taken_reads_as_before(yard: Yard, held: str) -> None:
    path = _job_file(yard, "taken", "command: 'true'\n")
    assert _run(yard, False, "job", "create", "-f", path, "-c", held, "-n", "taken")[0] == 0
    quick = _run(yard, False, "job", "create", "-f", path, "-c", held, "-n", "taken")
    whole = _run(yard, True, "job", "create", "-f", path, "-c", held, "-n", "taken")
    assert quick[:3] == whole[:3]
    assert quick[0] == 2 and "taken" in quick[2]
