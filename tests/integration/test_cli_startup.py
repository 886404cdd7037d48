"""A real CLI command against a real server builds one HTTP client (the health check and the
request share it) and loads no pydantic models, storage, database or server code; its output
is unchanged. No timing here: `bench/cli_startup.py` measures it."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("batchyard.spec", "batchyard.store", "batchyard.server", "batchyard.storage",
         "fsspec", "sqlalchemy", "fastapi", "uvicorn", "yaml", "alembic")

PROBE = r"""
import json, sys
out, count, args = sys.argv[1], sys.argv[2] == "count", sys.argv[3:]
sys.argv = ["batchyard", *args]
made = []
if count:  # only then is httpx imported up front, to count the clients built
    import httpx
    real_init = httpx.Client.__init__
    def init(self, *a, **kw):
        made.append(kw.get("base_url"))
        real_init(self, *a, **kw)
    httpx.Client.__init__ = init
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
    # and the table still renders (rich loads when a table is printed; piped, as here, it is
    # one line per row without rich's Table: issue 33 #14)
    table, listed = _run(yard, False, "experiment", "list")
    assert "rich.console" in table["modules"]
    assert "rich._emoji_codes" not in table["modules"]  # no ':code:' in it (startup.py)
    assert listed.splitlines()[0].split()[:2] == ["Name", "Jobs"], listed
    assert "startup" in yard.ok("experiment", "list").stdout
