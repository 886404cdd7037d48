"""The hostile job of issue 32, shared by the local-backend and the agent-node suites: a rank
that tries, as an attacker would, to take the node and the server over, records what each try
did, and still uses its own checkpoint, outputs, metrics and logs."""

from __future__ import annotations

import hashlib
import json
import site
from pathlib import Path
from typing import Any

import batchyard

# The rank: every try is recorded as "DONE" or "refused: <why>". ATTACK_HOME is the server's
# home (on the local backend), NODE_CRED the node's credential file (an agent's agent.json,
# a launcher's ticket), both as their paths on the host.
ATTACK = r'''
import json, os, shutil, site, sys

R = {}


def tried(label, act):
    try:
        act()
        R[label] = "DONE"
    except Exception as exc:  # every refusal, whatever its kind
        R[label] = f"refused: {type(exc).__name__}: {exc}"


def write(path):
    def act():
        with open(path, "a") as fh:
            fh.write("pwned\n")
    return act


def read(path):
    def act():
        with open(path, "rb") as fh:
            if not fh.read(65536):
                raise OSError("empty (hidden)")
    return act


import batchyard
package = os.path.dirname(batchyard.__file__)
home, cred = os.environ["ATTACK_HOME"], os.environ["NODE_CRED"]
out, evil = os.environ["BATCHYARD_OUTPUT_OUT"], os.environ["BATCHYARD_OUTPUT_EVIL"]
for label, path in {
        "write /etc/cron.d": "/etc/cron.d/batchyard-pwned",
        "write /root": "/root/.bashrc",
        "write /usr/local/bin": "/usr/local/bin/batchyard-pwned",
        "write a .pth in site-packages": os.path.join(site.getsitepackages()[0],
                                                      "batchyard-pwned.pth"),
        "write batchyard's package": os.path.join(package, "cli", "main.py"),
        "write the server's home": os.path.join(home, "pwned"),
}.items():
    tried(label, write(path))
for label, path in {"read /etc/shadow": "/etc/shadow",
                    "read the token": os.path.join(home, "token"),
                    "read the database": os.path.join(home, "batchyard.db"),
                    "read the TLS key": os.path.join(home, "tls", "server.key"),
                    "read the node credential": cred}.items():
    tried(label, read(path))
for name, target in {"tok": os.path.join(home, "token"),
                     "db": os.path.join(home, "batchyard.db"),
                     "shadow": "/etc/shadow", "cred": cred}.items():
    tried(f"link output {name}", lambda: os.symlink(target, os.path.join(out, name)))


def folder_link():
    shutil.rmtree(evil)
    os.symlink("/etc", evil)


tried("make an output folder a link to /etc", folder_link)
R["uid"], R["user"] = os.getuid(), os.environ.get("USER")
# what another job may try to read later
for path in ("/tmp/left-behind.txt", "/dev/shm/left-behind.txt",
             os.path.join(os.environ["BATCHYARD_JOB_DIR"], "shared", "left-behind.txt"),
             os.path.join(os.getcwd(), "left-behind.txt")):
    tried(f"leave {path}", write(path))
R["job dir"], R["work dir"] = os.environ["BATCHYARD_JOB_DIR"], os.getcwd()
# its own things still work
with open(os.path.join(os.environ["BATCHYARD_CHECKPOINT_DIR"], "step.txt"), "w") as fh:
    fh.write("7")
with open(os.path.join(out, "model.txt"), "w") as fh:
    fh.write("weights\n")
batchyard.log_metric("steps", 7.0, step=1)
with open(os.path.join(out, "report.json"), "w") as fh:
    json.dump(R, fh)
print("hostile job done:", json.dumps(R))
'''

# Another job, on the same node, reading what the first left (PEEK: paths, one a line).
PEEK = r'''
import json, os
R = {"uid": os.getuid()}
for path in os.environ["PEEK"].split("\n"):
    try:
        with open(path) as fh:
            R[path] = "READ: " + fh.read()
    except Exception as exc:
        R[path] = f"refused: {type(exc).__name__}"
with open(os.path.join(os.environ["BATCHYARD_OUTPUT_OUT"], "report.json"), "w") as fh:
    json.dump(R, fh)
print("peek done:", json.dumps(R))
'''

MUST_FAIL = ("write /etc/cron.d", "write /root", "write /usr/local/bin",
             "write a .pth in site-packages", "write batchyard's package",
             "write the server's home", "read /etc/shadow", "read the token",
             "read the database", "read the TLS key", "read the node credential",
             "make an output folder a link to /etc")


def host_files() -> dict[str, str]:
    """Digests of the host files the attack aims at (compared after it)."""
    package = Path(batchyard.__file__).parent
    out = {}
    for path in (Path("/root/.bashrc"), package / "cli" / "main.py"):
        out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() \
            else "missing"
    return out


def assert_host_untouched(before: dict[str, str]) -> None:
    assert host_files() == before
    for path in (Path("/etc/cron.d/batchyard-pwned"), Path("/usr/local/bin/batchyard-pwned"),
                 Path(site.getsitepackages()[0]) / "batchyard-pwned.pth"):
        assert not path.exists(), f"the job wrote {path}"


def assert_refused(report: dict[str, Any]) -> None:
    """Each try failed, and the tries that only a link could do left no link that works."""
    done = {k: v for k, v in report.items() if k in MUST_FAIL and not str(v).startswith(
        "refused")}
    assert done == {}, json.dumps(report, indent=1)


def report_of(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "report.json").read_text())
    return data
