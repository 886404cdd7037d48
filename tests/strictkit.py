"""Skipping a test for a missing component, or failing it: the components `scripts/setup.sh`
installs (root for namespaces, Azurite/npm, Chromium and Playwright, PostgreSQL, Ray, Open MPI
and mpi4py, Slurm, Docker/Podman, PyTorch...) are skipped on a developer's machine without
them, but under CI (``CI=true``) or ``BATCHYARD_TEST_STRICT=1`` (which `.ci/run` sets) a
missing one fails the run: ~140 tests once skipped silently when set-up only warned.

Every skip for a missing component goes through here (``missing``, ``requires``,
``importorskip``); a skip for any other reason (a case that does not apply here) stays a plain
``pytest.skip`` with its reason."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

STRICT_ENV = "BATCHYARD_TEST_STRICT"
MARK = "batchyard_requires"


def strict() -> bool:
    return (os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
            or os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes"))


def missing(reason: str) -> NoReturn:
    """Skip for ``reason`` (a component is missing), or fail under CI/strict."""
    if strict():
        pytest.fail(f"{reason} -- required under CI=true / {STRICT_ENV}=1 (scripts/setup.sh "
                    "installs it): failing instead of skipping", pytrace=False)
    pytest.skip(reason, allow_module_level=True)  # (also when called at import)


def requires(absent: bool, reason: str) -> pytest.MarkDecorator:
    """A mark for a test (or a module's ``pytestmark``) that needs a component: ``absent``
    means it is missing, and the test is skipped, or fails under CI/strict (conftest's
    ``pytest_runtest_setup`` applies it)."""
    return getattr(pytest.mark, MARK)(absent, reason=reason)


def apply(item: pytest.Item) -> None:
    for mark in item.iter_markers(MARK):
        if mark.args and mark.args[0]:
            missing(str(mark.kwargs.get("reason") or "a required component is missing"))


def importorskip(module: str, reason: str | None = None) -> ModuleType:
    """``pytest.importorskip``, failing under CI/strict."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing(reason or f"could not import {module!r}: {exc}")
