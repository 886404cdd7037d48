"""Newcomer frictions of issue 33 (#15-#18), through the real CLI and a real server: an inline
submit (`job create -c C -- python train.py --lr 0.1`, the current folder as the code);
shell completion of names and sizes read from the server (and nothing, quickly and quietly,
when no server answers); "did you mean ...?" for unknown names, sizes and job-file fields;
`datastore upload -t` naming the blob and printing where each file went; an output id spelt
one way in the rank's path and in `job file list`; `quota set` without "None GPUs"."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from yardkit import Result, Yard

pytestmark = pytest.mark.timeout(240)
C = "pair"


@pytest.fixture(scope="module")
def pair(yard: Yard) -> str:
    yard.ok("cluster", "create", "-n", C, "-s", "Standard_D2_v2", "-t", "2", "--wait")
    return C


def in_folder(yard: Yard, folder: Path, *args: str) -> Result:
    return yard.cli(*args, cwd=folder)


def complete(env: dict[str, str], line: str) -> tuple[list[str], subprocess.CompletedProcess[str],
                                                       float]:
    """What bash's completion asks `batchyard` for when tab is pressed after ``line``."""
    words = line.split()
    cword = len(words) if line.endswith(" ") else len(words) - 1
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "batchyard.cli.main"],
                          env={**env, "_BATCHYARD_COMPLETE": "complete_bash",
                               "COMP_WORDS": line, "COMP_CWORD": str(cword)},
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return proc.stdout.split(), proc, time.monotonic() - started


# 15: inline submit -----------------------------------------------------------------------------

TRAIN = """\
import os, sys
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "args", sys.argv[1:],
      "helper", open("helper.txt").read().strip(), flush=True)
"""


def test_inline_submit_runs_the_command_in_this_folder(yard: Yard, pair: str) -> None:
    folder = yard.work / "inline"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    (folder / "helper.txt").write_text("from-the-folder\n")
    run = in_folder(yard, folder, "job", "create", "-c", pair, "-n", "inline1", "--nodes", "2",
                    "--processes-per-node", "2", "--wait", "--", "python", "train.py",
                    "--lr", "0.1", "$BATCHYARD_JOB_ID", "two words")
    assert run.rc == 0, str(run)
    lines = [ln for ln in run.stdout.splitlines() if "] rank " in ln]
    assert len(lines) == 4, run.stdout
    job = yard.job("inline1")
    for rank in range(4):
        assert any(f"rank {rank} of 4 args ['--lr', '0.1', '{job['id']}', 'two words'] "
                   "helper from-the-folder" in ln for ln in lines), (rank, run.stdout)
    assert job["nodes"] == 2 and job["processes_per_node"] == 2
    assert run.stdout.splitlines()[-1].startswith("job inline1 succeeded")


def test_inline_submit_takes_the_other_options(yard: Yard, pair: str) -> None:
    folder = yard.work / "inline2"
    folder.mkdir()
    made = yard.cli("job", "create", "-c", pair, "-e", "inl", "--env", "X=1", "--tag", "k=v",
                    "--priority", "high", "-o", "json", "--", "sh", "-c", 'echo "x=$X"',
                    cwd=folder)
    assert made.rc == 0, str(made)
    data = made.json()
    assert data["experiment"] == "inl" and data["name"].startswith("job-")
    done = yard.wait_job(data["name"], experiment="inl")
    assert done["state"] == "succeeded", done
    assert done["spec"]["tags"]["k"] == "v" and done["priority"] == "high"
    logs = yard.ok("job", "logs", data["name"], "-e", "inl").stdout
    assert "x=1" in logs, logs
    image = yard.cli("job", "create", "-c", pair, "--image", "docker.io/library/busybox:1.36",
                     "--dry-run", "-o", "json", "--", "true", cwd=folder)
    if image.rc == 0:  # a node with a container runtime: the plan runs in the image
        assert "busybox:1.36" in image.json()["plan"], image.stdout
    else:  # none here: refused naming the image, never ignored
        assert image.rc == 2 and "image" in image.stderr, str(image)


def test_inline_and_a_file_together_is_a_clear_error(yard: Yard, pair: str) -> None:
    job_file = yard.write_job("both", {"command": "true"})
    both = yard.cli("job", "create", "-c", pair, "-f", str(job_file), "--", "python", "x.py")
    assert both.rc == 2, str(both)
    assert "not both" in both.stderr and "-f" in both.stderr and "Traceback" not in both.stderr
    neither = yard.cli("job", "create", "-c", pair)
    assert neither.rc == 2 and "-- python train.py" in neither.stderr, str(neither)
    ignored = yard.cli("job", "create", "-c", pair, "--ignore", "x", "--", "true")
    assert ignored.rc == 2 and "--ignore" in ignored.stderr, str(ignored)


# 16: completion --------------------------------------------------------------------------------


def test_completion_offers_names_from_the_server(yard: Yard, pair: str) -> None:
    yard.ok("experiment", "create", "compl-exp")
    job_file = yard.write_job("compl", {"command": "true"})
    yard.ok("job", "create", "-f", str(job_file), "-n", "compl-job", "-e", "compl-exp",
            "-c", pair)
    store = yard.work / "store"
    store.mkdir()
    yard.ok("datastore", "register", "compl-store", "--kind", "local", "--path", str(store))
    env = yard.env
    assert "compl-job" in complete(env, "batchyard job logs ")[0]
    assert complete(env, "batchyard job show -e compl-exp compl")[0] == ["compl-job"]
    assert complete(env, "batchyard job show -e compl-")[0] == ["compl-exp"]
    assert pair in complete(env, "batchyard cluster show ")[0]
    assert complete(env, "batchyard job create -c pa")[0] == [pair]
    assert complete(env, "batchyard cluster node list ")[0] == [pair]
    assert complete(env, "batchyard datastore show compl")[0] == ["compl-store"]
    sizes = complete(env, "batchyard cluster create -n x -s Standard_D3")[0]
    assert sizes == ["Standard_D3_v2"], sizes
    assert "Standard_NC6" in complete(env, "batchyard cluster create -n x -s Standard_NC")[0]
    assert "default" in complete(env, "batchyard job list -w ")[0]
    assert "job" in complete(env, "batchyard jo")[0]  # command names still


def _quiet(env: dict[str, str], line: str) -> tuple[list[str], float]:
    words, proc, took = complete(env, line)
    assert proc.returncode == 0, proc
    assert proc.stderr == "" and "Traceback" not in proc.stdout, proc
    return words, took


def test_completion_without_a_server_is_quiet_and_starts_none(tmp_path: Path) -> None:
    home = tmp_path / "no-server"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHYARD_")}
    env["BATCHYARD_HOME"] = str(home)
    words, _ = _quiet(env, "batchyard job logs ")
    assert words == []
    assert not (home / "server.json").exists()  # no server was started for it
    assert _quiet(env, "batchyard cluster create -n x -s Standard_D2")[0]  # sizes need none
    # a server that was here and is gone: refused at once, nothing offered
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    home.mkdir(exist_ok=True)
    (home / "server.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}",
                                                  "pid": 999999}))
    assert _quiet(env, "batchyard cluster show ")[0] == []


@pytest.fixture
def mute() -> Iterator[str]:
    """A server that takes the connection and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_completion_gives_up_quickly_on_a_silent_server(tmp_path: Path, mute: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHYARD_")}
    env.update(BATCHYARD_HOME=str(tmp_path), BATCHYARD_SERVER=mute)
    words, took = _quiet(env, "batchyard job show ")
    assert words == []
    assert took < 20, took  # the short timeout, not the client's minute (a loose bound)


# 16: suggestions ---------------------------------------------------------------------------


def test_unknown_names_and_sizes_suggest_the_nearest(yard: Yard, pair: str) -> None:
    missing = yard.cli("cluster", "show", "pari")
    assert missing.rc == 3 and f"did you mean {pair}?" in missing.stderr, str(missing)
    job_file = yard.write_job("near", {"command": "true"})
    yard.ok("job", "create", "-f", str(job_file), "-n", "resnet-lr01", "-c", pair)
    typo = yard.cli("job", "show", "resnet-lr1")
    assert typo.rc == 3 and "did you mean resnet-lr01?" in typo.stderr, str(typo)
    wrong_cluster = yard.cli("job", "create", "-f", str(job_file), "-c", "piar")
    assert wrong_cluster.rc == 3 and f"did you mean {pair}?" in wrong_cluster.stderr
    yard.ok("experiment", "create", "imagenet")
    exp = yard.cli("experiment", "show", "imagenett")
    assert exp.rc == 3 and "did you mean imagenet?" in exp.stderr, str(exp)
    size = yard.cli("cluster", "create", "-n", "sized", "-s", "Standard_D3", "-t", "0")
    assert size.rc == 2 and "did you mean Standard_D3_v2?" in size.stderr, str(size)
    far = yard.cli("cluster", "show", "zzzzzz")
    assert far.rc == 3 and "did you mean" not in far.stderr


def test_an_unknown_job_file_field_suggests_the_nearest(yard: Yard, pair: str) -> None:
    native = yard.write_job("nodefield", {"node": 2, "command": "true"})
    res = yard.cli("job", "create", "-f", str(native), "-c", pair)
    assert res.rc == 2 and "node: unknown field; did you mean nodes?" in res.stderr, str(res)
    batchai = yard.work / "job.json"
    batchai.write_text(json.dumps({"properties": {
        "nodeCont": 1, "customToolkitSettings": {"commandLine": "true"}}}))
    res = yard.cli("job", "create", "-f", str(batchai), "-c", pair)
    assert res.rc == 2 and "did you mean nodeCount?" in res.stderr, str(res)
    aml = yard.write_job("amlfield", {"type": "command", "command": "true",
                                      "resources": {"instance_cont": 1}})
    res = yard.cli("job", "create", "-f", str(aml), "-c", pair)
    assert res.rc == 2 and "did you mean instance_count?" in res.stderr, str(res)
    over = yard.cli("job", "create", "-f", str(yard.write_job("ok", {"command": "true"})),
                    "-c", pair, "--set", "limits.max_wallclock=1h")
    assert over.rc == 2 and "did you mean max_wall_clock?" in over.stderr, str(over)
    api = yard.http.post("/workspaces/default/jobs", json={"spec": {"command": "true",
                                                                    "node": 1}})
    assert api.status_code == 422, api.text
    assert api.json()["error"]["details"][0]["suggestion"] == "nodes"


# 17: datastore upload -t ---------------------------------------------------------------------


def test_upload_target_names_the_blob_for_a_file(yard: Yard, tmp_path: Path) -> None:
    store = tmp_path / "blobs"
    store.mkdir()
    yard.ok("datastore", "register", "blobs", "--kind", "local", "--path", str(store))
    model = tmp_path / "model.pt"
    model.write_bytes(b"weights")
    one = yard.ok("datastore", "upload", "blobs", str(model), "-t", "models/best.pt")
    assert (store / "models" / "best.pt").read_bytes() == b"weights"
    assert not (store / "models" / "best.pt" / "model.pt").exists()
    assert f"{model} -> blobs:models/best.pt" in one.stdout, str(one)
    into = yard.js("datastore", "upload", "blobs", str(model), "-t", "folder/")
    assert (store / "folder" / "model.pt").read_bytes() == b"weights"
    assert into["uploaded"] == [{"source": str(model), "path": "folder/model.pt", "size": 7}]
    plain = yard.ok("datastore", "upload", "blobs", str(model))
    assert (store / "model.pt").is_file() and "-> blobs:model.pt" in plain.stdout
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("b")
    listed = yard.ok("datastore", "upload", "blobs", str(tree), "-t", "data").stdout
    assert (store / "data" / "sub" / "b.txt").read_text() == "b"
    assert "-> blobs:data/a.txt" in listed and "-> blobs:data/sub/b.txt" in listed, listed
    assert "uploaded 2 file(s)" in listed


# 18: an output id spelt one way, quota text ----------------------------------------------------


def test_an_output_id_is_spelt_one_way(yard: Yard, pair: str) -> None:
    job = yard.work / "outputs-job.json"
    job.write_text(json.dumps({"properties": {
        "nodeCount": 1,
        "customToolkitSettings": {"commandLine":
                                  'echo "dir=$AZ_BATCHAI_OUTPUT_MODEL" && '
                                  'echo w > "$AZ_BATCHAI_OUTPUT_MODEL/weights.txt"'},
        "outputDirectories": [{"id": "MODEL",
                               "pathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/result"}]}}))
    yard.ok("job", "create", "-f", str(job), "-n", "spelt", "-c", pair)
    assert yard.wait_job("spelt")["state"] == "succeeded"
    logs = yard.ok("job", "logs", "spelt").stdout
    folder = next(ln.split("dir=", 1)[1] for ln in logs.splitlines() if "dir=" in ln)
    assert folder.rstrip("/").endswith("/outputs/MODEL"), folder
    files = [f["path"] for f in yard.js("job", "file", "list", "spelt")["files"]]
    assert "outputs/MODEL/weights.txt" in files, files


def test_quota_set_says_no_limit_not_none(yard: Yard) -> None:
    out = yard.ok("quota", "set", "--family", "standardDv2Family", "--vcpus", "64").stdout
    assert "None" not in out and "no GPU limit" in out and "64 vCPUs" in out, out
