"""Fixtures for the integration and e2e tests: a real batchyard server over HTTP, the real
CLI as a subprocess, real node launchers and rank processes. No mocks.

Each test module gets its own ``BATCHYARD_HOME`` (a tmp dir) and its own server; at teardown
the server is stopped and every process that still refers to that home (launchers, ranks,
stray grandchildren) is killed, so one module cannot leak into the next. Helpers live in
``yardkit.py`` (importable from test modules as ``from yardkit import ...``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _pytest.tmpdir import TempPathFactory

import pgkit
import strictkit
from yardkit import CLUSTER, Yard

# Jobs run as an unprivileged uid with a /tmp of their own (issue 32): a file a test hands a
# job by path (a marker it waits for, a script, a data folder) must lie outside /tmp and
# under no 0700 folder (pytest's own /tmp/pytest-of-root is one). So the session's tmp dirs
# live under /var/tmp, readable by all (0755): only the tests' scratch files are there.
SHARED_TMP = Path("/var/tmp/batchyard-tests")
STALE = 24 * 3600.0


class ReachableTmp(TempPathFactory):
    """pytest's tmp dirs, each opened to every uid (0755) when made."""

    def getbasetemp(self) -> Path:
        fresh = self._basetemp is None
        base = super().getbasetemp()
        if fresh:
            os.chmod(base, 0o755)
        return base

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        path = super().mktemp(basename, numbered)
        os.chmod(path, 0o755)
        return path


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is not None:
        return
    SHARED_TMP.mkdir(mode=0o755, exist_ok=True)
    for old in SHARED_TMP.iterdir():  # sessions that ended long ago (or were killed)
        if time.time() - old.lstat().st_mtime > STALE:
            shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = str(SHARED_TMP / f"{os.getpid()}-{secrets.token_hex(4)}")
    config._ours_basetemp = True  # type: ignore[attr-defined]
    config._tmp_path_factory = ReachableTmp.from_config(config, _ispytest=True)  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's scratch files go with it, unless a test failed (kept to look at)."""
    if getattr(config, "_ours_basetemp", False) and not getattr(config, "_had_failure", False):
        shutil.rmtree(str(config.option.basetemp), ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if outcome.get_result().failed:  # type: ignore[attr-defined]
        item.config._had_failure = True  # type: ignore[attr-defined]


def pytest_runtest_setup(item: pytest.Item) -> None:
    strictkit.apply(item)  # tests that need a component: skipped, or failed under CI/strict


@pytest.fixture(scope="session", autouse=True)
def _postgres() -> Iterator[None]:
    """With BATCHYARD_TEST_DB=postgresql every Yard's server keeps its state in a real
    PostgreSQL (one server for the session, a database per home), stopped by pid at the end."""
    if not pgkit.wanted():
        yield
        return
    server = pgkit.Postgres()
    server.start()
    pgkit.ACTIVE = server
    try:
        yield
    finally:
        pgkit.ACTIVE = None
        server.stop()


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[Callable[[], str]]:
    """A maker of fresh PostgreSQL databases, for tests that need PostgreSQL whatever the
    suite runs on: the session's server when there is one, else one of their own (started
    once, stopped by pid at the end)."""
    if pgkit.pg_bin() is None:
        strictkit.missing("PostgreSQL is not installed")
    if pgkit.ACTIVE is not None:
        yield pgkit.ACTIVE.create_database
        return
    server = pgkit.Postgres()
    server.start()
    try:
        yield server.create_database
    finally:
        server.stop()


@pytest.fixture(scope="session")
def openid_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real OpenID provider (npm oidc-provider) on loopback for the single sign-on tests,
    one for the session, stopped by pid at the end (tests/oidckit.py)."""
    import oidckit

    why = oidckit.missing()
    if why is not None:
        strictkit.missing(why)
    provider = oidckit.OpenIdProvider(tmp_path_factory.mktemp("oidc"), dict(oidckit.ACCOUNTS))
    provider.start()
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    """A fresh home and a running server, shared by the tests of one module."""
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    try:
        y.start_server()
        yield y
    finally:
        y.stop()


@pytest.fixture(scope="module")
def cluster2(yard: Yard) -> str:
    """A 2-node local cluster (2 vCPU each) in the default workspace."""
    yard.ok("cluster", "create", "-n", CLUSTER, "-s", "Standard_D2_v2", "-t", "2")
    yard.wait_cluster(CLUSTER, 2)
    return CLUSTER
