"""The job's view (node/mountview.py, entered by node/sandbox.py run as a script): all but its
own folders read-only, a /tmp of its own, hidden folders empty, a hidden credential file
empty, folders it could not pass shown only where it needs them, its own account in
/etc/passwd, and run as its unprivileged uid. Root only (mount namespaces)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import strictkit
from batchyard.node import jobuser, sandbox

pytestmark = strictkit.requires(os.geteuid() != 0, "root only (mount namespaces)")

PROBE = r'''
import json, os, pwd, sys
out = {"uid": os.getuid(), "name": pwd.getpwuid(os.getuid()).pw_name}
def write(path):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        return "written"
    except OSError as exc:
        return exc.strerror
for label, path in json.loads(sys.argv[1]).items():
    out[label] = write(path)
out["hidden"] = sorted(os.listdir(sys.argv[2]))
out["key"] = open(sys.argv[3]).read()
out["tmp"] = sorted(os.listdir("/tmp"))
out["shown"] = open(sys.argv[4]).read()
print(json.dumps(out))
'''


def test_the_view(tmp_path: Path) -> None:
    closed = tmp_path / "closed"  # a 0700 folder the job's uid cannot pass
    own = closed / "node" / "job"
    ro = closed / "venv"
    secret = tmp_path / "home"
    for folder in (own, ro, secret):
        folder.mkdir(parents=True)
    os.chmod(closed, 0o700)
    (ro / "lib.py").write_text("shown read-only")
    (secret / "token").write_text("admin")
    key = tmp_path / "server.key"
    key.write_text("private key")
    private_tmp = tmp_path / "systmp"
    private_tmp.mkdir(mode=0o1777)
    os.chmod(private_tmp, 0o1777)
    uid = jobuser.uid_of("view-test", str(tmp_path / "uids"))
    os.chown(own, uid, uid)
    etc = jobuser.account_files(tmp_path / "etc", "view-test", uid, str(own))
    python = [sys.base_prefix, sys.prefix]  # shown read-only too (it may be under /root)
    hide = sorted({str(secret), str(closed), *jobuser.barriers(python, uid)})
    spec = {"hide": hide, "hide_files": [str(key)],
            "binds": [[str(own), "rw"], [str(ro), "ro"], *[[p, "ro"] for p in python]],
            "tmp": str(private_tmp),
            "etc": etc, "uid": uid, "home": str(own), "readonly": True}
    targets = {"own": str(own / "f"), "etc": "/etc/by-test", "usr": "/usr/local/bin/x",
               "ro": str(ro / "x"), "tmpfile": "/tmp/mine", "venv": sys.prefix + "/x.pth"}
    (Path("/tmp") / "host-only-file").write_text("host")
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", sandbox.__file__, json.dumps(spec), "--",
             sys.executable, "-I", "-S", "-c", PROBE, json.dumps(targets), str(secret),
             str(key), str(ro / "lib.py")],
            capture_output=True, text=True, timeout=60, cwd=str(own))
    finally:
        (Path("/tmp") / "host-only-file").unlink()
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["uid"] == uid and out["name"] == "by-view-test"
    assert out["own"] == "written" and out["tmpfile"] == "written"
    assert out["etc"] == out["usr"] == out["ro"] == out["venv"] == "Read-only file system"
    assert out["hidden"] == [] and out["key"] == ""
    assert "host-only-file" not in out["tmp"] and "mine" in out["tmp"]
    assert out["shown"] == "shown read-only"
    assert (own / "f").read_text() == "x" and (private_tmp / "mine").exists()
    assert not (secret / "x").exists() and (secret / "token").read_text() == "admin"
