"""Tests that need a component `scripts/setup.sh` installs skip without it on a developer's
machine, and fail under CI (``CI=true``) or ``BATCHYARD_TEST_STRICT=1`` (issue 33, item 12):
~140 tests skipped silently on a CI machine that lacked root, Azurite, Chromium, PostgreSQL or
Ray. Checked by running pytest on a small test file with the suite's own conftest, and by
reading every skip in tests/: each goes through tests/strictkit.py, or is one of the few that
skip for another reason."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
SAMPLE = '''
import pytest
import strictkit

pytestmark = strictkit.requires(True, "the frobnicator is not installed")


def test_needs_it():
    pass


def test_imports_it():
    strictkit.importorskip("no_such_module_here")
'''
# skips that are not a missing component: a case that does not apply on this machine
ALLOWED = {
    ("integration/test_azureml_compat.py", "every candidate package is already installed"),
    ("integration/test_azureml_compat.py", "pip could not reach a package index"),
    ("integration/test_cli_newcomer_rest.py", "this machine has GPUs"),
    ("e2e/test_containers.py", "one runtime is enough"),
    ("integration/test_failure_causes.py", "memory controller on this host"),  # the kernel's
}


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "BATCHYARD_TEST_STRICT",
                                                               "BATCHYARD_TEST_DB")}
    clean["PYTHONPATH"] = str(TESTS)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_sample.py")],
                          cwd=tmp_path, env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)


def test_a_missing_component_skips_on_a_developers_machine(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 skipped" in done.stdout, done.stdout


@pytest.mark.parametrize("env", [{"CI": "true"}, {"BATCHYARD_TEST_STRICT": "1"}])
def test_a_missing_component_fails_under_ci_or_strict(tmp_path: Path,
                                                      env: dict[str, str]) -> None:
    done = _run(tmp_path, **env)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "2 errors" in done.stdout, done.stdout  # (failed in their set-up)
    assert "the frobnicator is not installed" in done.stdout
    assert "failing instead of skipping" in done.stdout


def test_ci_run_sets_strict() -> None:
    script = (TESTS.parent / ".ci" / "run").read_text()
    assert re.search(r"^export BATCHYARD_TEST_STRICT=1$", script, re.M), script


def test_every_skip_goes_through_strictkit_or_is_allowed() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name in ("strictkit.py", Path(__file__).name):
            continue
        rel = path.relative_to(TESTS).as_posix()
        for line in path.read_text().splitlines():
            skips = re.search(r"pytest\.(skip|importorskip)\(|mark\.skipif|mark\.skip\(", line)
            if skips and not any(rel == where and why in _context(path, line)
                                 for where, why in ALLOWED):
                found.append(f"{rel}: {line.strip()}")
    assert not found, "skips that bypass tests/strictkit.py:\n" + "\n".join(found)


def _context(path: Path, line: str) -> str:
    lines = path.read_text().splitlines()
    at = lines.index(line)
    return "\n".join(lines[at:at + 2])
