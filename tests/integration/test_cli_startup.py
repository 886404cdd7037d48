"""A real CLI command against a real server builds one HTTP client (the health check and the
request share it) and loads no pydantic models, storage, database or server code; its output
is unchanged. No timing here: `bench/cli_startup.py` measures it."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("batchyard.spec", "batchyard.store", "batchyard.server", "batchyard.storage",
         "fsspec", "sqlalchemy", "fastapi", "uvicorn", "yaml", "alembic",
         "httpx", "pydantic")

PROBE = r"""
import json, sys
out, count, args = sys.argv[1], sys.argv[2] == "count", sys.argv[3:]
sys.argv = ["batchyard", *args]
made = []
if count:  # only then are the wires imported up front, to count the clients built
    from batchyard.client import wire, wire_httpx
    def counted(cls):
        real_init = cls.__init__
        def init(self, base_url, *a, **kw):
            made.append(base_url)
            real_init(self, base_url, *a, **kw)
        cls.__init__ = init
    counted(wire.Wire)
    counted(wire_httpx.HttpxWire)
code = 0
try:
    from batchyard.cli.main import main
    main()
except SystemExit as exc:
    code = exc.code or 0
with open(out, "w") as fh:
    json.dump({"code": code, "modules": sorted(sys.modules), "clients": made}, fh)
"""


def _run(yard, count: bool, *args: str) -> tuple[dict, str]:
    out = yard.work / "probe.json"
    proc = subprocess.run([sys.executable, "-c", PROBE, str(out),
                           "count" if count else "-", *args],
                          env=yard.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["code"] == 0, proc.stderr
    return data, proc.stdout


def test_job_list_one_client_nothing_heavy(yard):
    yard.ok("experiment", "create", "-n", "startup")
    data, _ = _run(yard, False, "job", "list", "-o", "json")
    heavy = sorted(m for m in data["modules"]
                   if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == []
    assert "httpx._main" not in data["modules"]  # httpx without its own command line

    data, stdout = _run(yard, True, "job", "list", "-o", "json")
    assert len(data["clients"]) == 1, data["clients"]
    assert json.loads(stdout) == yard.js("job", "list")
    # and the table still renders: piped, as here, one line per row as squeue prints it
    # (issue 33 #14), written without Rich at all (issue 37: cli/out.py); a terminal's table
    # is Rich's (tests/unit/cli/test_cli_table_layout.py)
    table, listed = _run(yard, False, "experiment", "list")
    assert "rich.console" not in table["modules"]
    assert "rich._emoji_codes" not in table["modules"]  # no ':code:' in it (startup.py)
    assert listed.splitlines()[0].split()[:2] == ["Name", "Jobs"], listed
    assert "startup" in yard.ok("experiment", "list").stdout
