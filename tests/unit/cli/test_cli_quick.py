"""The CLI's quick path (cli/quick.py) takes exactly what Typer takes and sends what the whole
CLI sends, or leaves the command line to the whole CLI; the help cache (cli/helpcache.py)
replays a page only from private files, and forgets it when the code changes. The same runs
against a real server: tests/integration/test_cli_quick_submit.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchyard.cli import helpcache, quick

ENV = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}


def _typer_params(args: list[str]) -> dict[str, Any]:
    from typer.main import get_command

    from batchyard.cli.main import with_parts

    group: Any = get_command(with_parts("job"))
    create = group.commands["job"].commands["create"]
    ctx = create.make_context("create", list(args))
    return dict(ctx.params)


TAKEN = [
    ["-f", "job.yaml"],
    ["--config-file", "job.yaml", "-c", "q", "-n", "a", "-w", "ws", "-e", "exp"],
    ["-f", "a.yaml", "-f", "b.yaml", "-o", "json"],
    ["--config-file=job.yaml", "--name=x", "--cluster=c", "--output=table"],
    ["-f", "job.yaml", "-g", "rg", "--storage-account-name", "acct", "--workspace", "w"],
    ["-f", "job.yaml", "-n", ""],
]
LEFT = [
    ["-fjob.yaml"],                        # Typer's glued short form: the whole CLI
    ["-f", "job.yaml", "--wait"],
    ["-f", "job.yaml", "--dry-run"],
    ["-f", "job.yaml", "--set", "nodes=2"],
    ["-f", "job.yaml", "-n", "-x"],        # a value like an option
    ["-f", "job.yaml", "-o", "yaml"],      # Typer refuses it, naming --output
    ["-f", "job.yaml", "-w", "a/b"],       # path_safe refuses it, naming --workspace
    ["-f", "job.yaml", "-e", ".."],
    ["-f", "job.yaml", "--", "python", "x.py"],
    ["-c", "q", "--", "true"],
    ["-n", "x"],                           # no file
    ["-f", "job.yaml", "-c"],              # a value missing
    ["-f", "job.yaml", "--name=a", "extra"],
    ["-f", "job.yaml", "--what-if"],       # in words: Rich's, the whole CLI's
]


@pytest.mark.parametrize("args", TAKEN)
def test_the_quick_path_takes_what_typer_takes(args: list[str], monkeypatch: Any) -> None:
    monkeypatch.delenv("BATCHYARD_WORKSPACE", raising=False)
    found = quick.parse_create(args)
    assert found is not None, args
    params = _typer_params(args)
    for key, value in found.items():
        want = params[key]
        want = getattr(want, "value", want)  # the Output enum
        assert str(want) == value, (key, args)
    for key in ("name", "cluster", "workspace", "experiment", "resource_group",
                "storage_account_name"):
        if key not in found:
            assert params[key] is None, (key, args)
    assert getattr(params["output"], "value", None) == found.get("output", "table")


@pytest.mark.parametrize("args", LEFT)
def test_anything_else_is_left_to_the_whole_cli(args: list[str], monkeypatch: Any) -> None:
    monkeypatch.delenv("BATCHYARD_WORKSPACE", raising=False)
    assert quick.parse_create(args) is None


def test_what_if_in_words_and_twice_is_left_to_the_whole_cli() -> None:
    """`--what-if` words need Rich: only `-o json` is answered here (run() returns None
    before any request for the others)."""
    assert _typer_params(["-f", "j.yaml", "--what-if", "-o", "json"])["what_if"] is True
    assert quick.run(["job", "create", "-f", "j.yaml", "--what-if"]) is None
    assert quick.run(["job", "create", "-f", "j.yaml", "--what-if", "--what-if", "-o",
                      "json"]) is None


def test_the_workspace_comes_from_the_environment_as_typer_takes_it(monkeypatch: Any) -> None:
    monkeypatch.setenv("BATCHYARD_WORKSPACE", "envws")
    found = quick.parse_create(["-f", "job.yaml"])
    assert found is not None and found["workspace"] == "envws"
    assert _typer_params(["-f", "job.yaml"])["workspace"] == "envws"
    assert quick.parse_create(["-f", "job.yaml", "-w", "given"])["workspace"] == "given"
    monkeypatch.setenv("BATCHYARD_WORKSPACE", "")  # empty: not set, for Click too
    assert "workspace" not in (quick.parse_create(["-f", "job.yaml"]) or {"workspace": 1})
    monkeypatch.setenv("BATCHYARD_WORKSPACE", "a/b")  # refused by path_safe: whole CLI
    assert quick.parse_create(["-f", "job.yaml"]) is None


def test_a_native_document_is_sent_as_the_loader_reads_it(tmp_path: Path) -> None:
    from batchyard.spec.loader import load_job_file

    (tmp_path / "src").mkdir()
    job = tmp_path / "job.yaml"
    job.write_text("name: j\ncommand: python t.py\ncode: ./src\nnodes: 2\n"
                   "env: {A: '1'}\nlimits: {max_wall_clock: 2h}\n")
    body = quick.document_body(str(job))
    assert body is not None
    assert body["code"] == str(tmp_path / "src")
    from batchyard.spec.job import JobSpec

    assert JobSpec.model_validate(body) == load_job_file(job)


@pytest.mark.parametrize("text", [
    "command: x\ninputs: {d: {path: ./data}}\n",       # relative paths the loader resolves
    "command: x\nmounts: [{kind: local, source: ./m, target: /m}]\n",
    "command: x\narray: 0-3\n",
    "command: x\nwhen: 2024-01-01\n",                  # a date: YAML's, not JSON's
    "command: x\nenv: {1: a}\n",                       # a number as a key
    "command: x\nlimits: {max_wall_clock: .nan}\n",
    "command: x\ncode: [a]\n",
    "nodeCount: 1\ncustomToolkitSettings: {commandLine: x}\n",   # Batch AI
    "$schema: https://azuremlschemas.azureedge.net/latest/commandJob.schema.json\n"
    "command: x\n",                                    # AML
    "sweep: {}\ntrial: {command: x}\n",                # a sweep
    "- a\n- b\n",
    "command: [unclosed\n",                            # a syntax error: the loader says it
])
def test_other_documents_go_to_the_loader(tmp_path: Path, text: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(text)
    assert quick.document_body(str(job)) is None
    assert quick.document_body(str(tmp_path / "missing.yaml")) is None


def _cli(args: list[str], env: dict[str, str], *, whole: bool = False) -> tuple[int, str, str,
                                                                              list[str]]:
    """Run the batchyard script's entry point (``whole``: with the quick path off); its exit
    code, stdout, stderr and whether Typer/Rich/pydantic/httpx were imported."""
    code = (
        "import sys, json\n"
        "sys.argv = ['batchyard', *sys.argv[1:]]\n"
        "from batchyard.cli import quick\n"
        + ("quick.run = lambda *a, **kw: None\n" if whole else "")
        + "rc = 0\n"
        "try:\n"
        "    quick.main()\n"
        "except SystemExit as exc:\n"
        "    rc = exc.code or 0\n"
        "sys.stdout.flush()\n"
        "heavy = [m for m in ('typer', 'rich', 'pydantic', 'httpx', 'click') if m in "
        "sys.modules]\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(heavy) + '\\n')\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **ENV, **env})
    err, _, tail = proc.stderr.rpartition("\nMODULES ")
    return proc.returncode, proc.stdout, err, json.loads(tail)


@pytest.mark.parametrize("args", [["--version"], ["-V"], ["version"],
                                  ["version", "-o", "json"], ["version", "--output", "table"]])
def test_version_is_said_as_before_without_typer(args: list[str], tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    rc, out, err, heavy = _cli(args, env)
    assert heavy == [], args
    assert (rc, out, err) == _cli(args, env, whole=True)[:3]


def test_help_is_kept_and_replayed_byte_for_byte(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    for args in (["--help"], ["job", "create", "--help"], ["job", "list", "-h"]):
        first = _cli(args, env)
        assert first[0] == 0 and "typer" in first[3], args  # made by Typer, and kept
        again = _cli(args, env)
        assert again[:3] == first[:3], args
        assert again[3] == [], args                         # replayed: nothing heavy
        assert _cli(args, env, whole=True)[:3] == first[:3]
    folder = tmp_path / "batchyard" / "help"
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    assert oct((tmp_path / "batchyard").stat().st_mode & 0o777) == oct(0o700)
    pages = list(folder.iterdir())
    assert len(pages) == 3
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in pages)


def test_errors_and_other_settings_are_not_kept(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    rc, _, err, _ = _cli(["job", "nosuch", "--help"], env)
    assert rc == 2 and "nosuch" in err
    assert not (tmp_path / "batchyard" / "help").exists() or \
        list((tmp_path / "batchyard" / "help").iterdir()) == []
    narrow = _cli(["--help"], {**env, "COLUMNS": "60"})
    wide = _cli(["--help"], {**env, "COLUMNS": "120"})
    assert narrow[1] != wide[1]
    assert _cli(["--help"], {**env, "COLUMNS": "60"})[:3] == narrow[:3]


def test_completion_is_never_replayed(tmp_path: Path, monkeypatch: Any) -> None:
    _kept(tmp_path, {"XDG_CACHE_HOME": str(tmp_path)})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setenv("_BATCHYARD_COMPLETE", "complete_bash")
    assert helpcache.replay(["--help"]) is False
    assert quick.run(["--help"], own=True) is None


def _kept(tmp_path: Path, env: dict[str, str]) -> Path:
    _cli(["--help"], env)
    pages = list((tmp_path / "batchyard" / "help").iterdir())
    assert len(pages) == 1
    return pages[0]


def test_a_page_others_may_write_is_not_replayed(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    page = _kept(tmp_path, env)
    real = page.read_bytes()
    assert _cli(["--help"], env)[3] == []  # replayed while private
    stored, _, _ = real.partition(helpcache.SEP)
    page.write_bytes(stored + helpcache.SEP + b"words put in a help page\n")
    for mode in (0o620, 0o602):
        page.chmod(mode)
        rc, out, _, heavy = _cli(["--help"], env)
        assert rc == 0 and "words put in" not in out and "typer" in heavy, oct(mode)
    page.chmod(0o600)  # a private page holds what this user put there (here: the words)
    folder = page.parent
    for target, mode in ((folder, 0o770), (folder, 0o707), (folder.parent, 0o777)):
        page.write_bytes(stored + helpcache.SEP + b"words put in a help page\n")
        page.chmod(0o600)
        target.chmod(mode)
        rc, out, _, heavy = _cli(["--help"], env)
        assert "words put in" not in out and "typer" in heavy, (target, oct(mode))
        target.chmod(0o700)


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    page = _kept(tmp_path, env)
    stored, _, _ = page.read_bytes().partition(helpcache.SEP)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(stored + helpcache.SEP + b"words put in a help page\n")
    elsewhere.chmod(0o600)
    page.unlink()
    page.symlink_to(elsewhere)
    rc, out, _, heavy = _cli(["--help"], env)
    assert rc == 0 and "words put in" not in out and "typer" in heavy


def test_the_key_changes_with_the_code(tmp_path: Path) -> None:
    args = ["--help"]
    before = helpcache.key(args)
    assert before == helpcache.key(args)
    source = Path(helpcache.__file__)
    st = source.stat()
    try:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        assert helpcache.key(args) != before  # an edited module: a page made anew
    finally:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert helpcache.key(args) == before
    import typer

    assert any(str(Path(typer.__file__).parent) in line for line in before.splitlines())
    assert helpcache.key(["job", "--help"]) != before
