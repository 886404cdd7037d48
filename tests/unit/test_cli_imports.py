"""The CLI's start-up stays light (no timing here; `bench/cli_startup.py` measures it): help
and `version` import neither the spec's pydantic models nor storage, the database, the
server, YAML or the HTTP client, and the HTTP client's module loads httpx without httpx's own
command line. Each check runs the real entry point in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Modules a command that only parses its arguments and prints must not pay for.
HEAVY = ("batchyard.spec", "batchyard.store", "batchyard.server", "batchyard.storage",
         "fsspec", "sqlalchemy", "fastapi", "uvicorn", "yaml", "alembic")
NO_HTTP = ("httpx", "ssl", "batchyard.client.http", "batchyard.client.local_server")

PROBE = r"""
import json, sys
out, args = sys.argv[1], sys.argv[2:]
sys.argv = ["batchyard", *args]
code = 0
try:
    from batchyard.cli.main import main
    main()
except SystemExit as exc:
    code = exc.code or 0
with open(out, "w") as fh:
    json.dump({"code": code, "modules": sorted(sys.modules)}, fh)
"""


def _modules_after(tmp_path, *args: str) -> set[str]:
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHYARD_")}
    env["BATCHYARD_HOME"] = str(tmp_path / "home")
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # no help page kept by an earlier probe
    proc = subprocess.run([sys.executable, "-c", PROBE, str(out), *args], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["code"] == 0, (args, proc.stdout, proc.stderr)
    return set(data["modules"])


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize("args", [("--help",), ("version",), ("job", "--help"),
                                  ("cluster", "--help"), ("datastore", "--help")])
def test_help_and_version_import_nothing_heavy(tmp_path, args):
    modules = _modules_after(tmp_path, *args)
    assert "batchyard.cli.quick" in modules  # the probe did run the real CLI's main() ...
    if args != ("version",):  # (... which answers `version` without Typer: cli/quick.py)
        assert "batchyard.cli.startup" in modules
    assert _loaded(modules, HEAVY) == []
    assert _loaded(modules, NO_HTTP) == []


GROUPS = ("batchyard.cli.server_cmd", "batchyard.cli.agent", "batchyard.cli.workspace",
          "batchyard.cli.cluster", "batchyard.cli.job", "batchyard.cli.sweep",
          "batchyard.cli.datastore")


@pytest.mark.parametrize(("args", "group"), [
    (("version",), None), (("job", "list", "--help"), "batchyard.cli.job"),
    (("cluster", "--help"), "batchyard.cli.cluster"), (("--ca-file", "x", "datastore", "-h"),
                                                       "batchyard.cli.datastore")])
def test_only_the_group_run_is_imported(tmp_path, args, group):
    # each group's module loads when it runs; root help lists the groups, and the commands
    # `portal` and `agent` (server_cmd's and agent's), from cli/groups.py
    modules = _modules_after(tmp_path, *args)
    assert [g for g in GROUPS if g in modules] == ([group] if group else [])
    listed = _modules_after(tmp_path, "--help")
    assert [g for g in GROUPS if g in listed] == []
    assert [g for g in GROUPS if g in _modules_after(tmp_path, "portal", "-h")] == [
        "batchyard.cli.server_cmd"]


def test_a_command_with_options_still_loads_no_models(tmp_path):
    # `job list --help` parses the group's options first (typer coerces them), then helps
    modules = _modules_after(tmp_path, "job", "list", "--help")
    assert _loaded(modules, HEAVY + NO_HTTP) == []
    # nor pydantic: plain values are checked without Typer's TypeAdapters (cli/startup.py),
    # nor rich's markdown and traceback modules, which Typer's help imports but never uses here
    for args in (("job", "list", "--help"), ("version", "-o", "json"), ("--help",)):
        modules = _modules_after(tmp_path, *args)
        assert _loaded(modules, ("pydantic", "rich.markdown", "rich.traceback")) == [], args
    # nor rich's emoji codes, where no text holds one (cli/startup.py: lazy_emoji_codes)
    for args in (("--help",), ("job", "--help"), ("job", "list", "--help")):
        assert "rich._emoji_codes" not in _modules_after(tmp_path, *args), args


def test_http_client_module_skips_httpx_command_line():
    code = (
        "import sys, json; import batchyard.client.http as h; h.import_httpx(); "
        "loaded = '_main' in sys.modules['httpx'].__dict__ or 'httpx._main' in sys.modules; "
        "extra = [m for m in ('click', 'pygments', 'rich') if m in sys.modules]; "
        "main = h.httpx.main; import httpx._main as real; "
        "print(json.dumps({'loaded': loaded, 'extra': extra, 'callable': callable(main), "
        "'real': hasattr(real, 'print_response')}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    # httpx came without its CLI (click, pygments, rich progress bars) ...
    assert data["loaded"] is False and data["extra"] == []
    # ... while `httpx.main` still works and `import httpx._main` gets the real module
    assert data["callable"] and data["real"]
