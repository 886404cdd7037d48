"""Identities on a server of several processes (``--workers 2``, real PostgreSQL): what one
process caches of a token and its roles is dropped in every process as soon as another
changes it (a revoked token, a disabled user, a role taken away are refused at once
wherever the next call lands, well before the cache's own expiry); failed sign-ins are
counted across the processes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from yardkit import Yard

pytestmark = pytest.mark.timeout(300)
CACHE_TTL = 5.0  # security.cache.TTL: a stale answer would last this long


def start(tmp_path_factory: pytest.TempPathFactory, database: str, failures: int) -> Yard:
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env.update(BATCHYARD_DB_URL=database, BATCHYARD_WORKERS="2",
                 BATCHYARD_AUTH_FAILURES=str(failures), BATCHYARD_AUTH_WINDOW="30")
    y.start_server()
    return y


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory,
        postgres_database: Callable[[], str]) -> Iterator[Yard]:
    """Refused tokens here are many: the limit on failures is out of the way."""
    y = start(tmp_path_factory, postgres_database(), 10_000)
    try:
        y.ok("workspace", "create", "wk")
        y.ok("cluster", "create", "-n", "c", "-w", "wk", "-s", "Standard_D2_v2", "-t", "0")
        yield y
    finally:
        y.stop()


def fresh(y: Yard, token: str, path: str = "/health", method: str = "GET",
          **kw: object) -> httpx.Response:
    """One call on a new connection: the kernel spreads those over the processes."""
    return httpx.request(method, y.url + "/api/v1" + path, timeout=30,
                         headers={"Authorization": f"Bearer {token}"}, **kw)  # type: ignore


def warm(y: Yard, token: str) -> None:
    """Until both processes have answered this token (each has cached it)."""
    pids: set[int] = set()
    deadline = time.monotonic() + 30
    while len(pids) < 2:
        answer = fresh(y, token)
        assert answer.status_code == 200, answer.text
        pids.add(answer.json()["pid"])
        assert time.monotonic() < deadline, f"only processes {pids} answered"


def user_with_token(y: Yard, name: str) -> str:
    y.ok("user", "create", name)
    token: str = y.js("token", "create", "--user", name)["token"]
    return token


def test_a_revoked_token_is_refused_by_every_process_at_once(two: Yard) -> None:
    token = user_with_token(two, "rev")
    warm(two, token)
    made = two.js("token", "list", "--user", "rev")[0]["id"]
    two.ok("token", "revoke", str(made))
    started = time.monotonic()
    time.sleep(0.2)
    codes = [fresh(two, token).status_code for _ in range(40)]
    assert time.monotonic() - started < CACHE_TTL  # faster than the cache would forget
    assert set(codes) == {401}, codes


def test_a_disabled_user_and_a_removed_role_count_at_once_everywhere(two: Yard) -> None:
    token = user_with_token(two, "dis")
    two.ok("role", "assign", "-w", "wk", "--user", "dis", "--role", "contributor")
    warm(two, token)
    for _ in range(10):  # each process has the roles cached too
        assert fresh(two, token, "/workspaces/wk/jobs").status_code == 200
    two.ok("role", "remove", "-w", "wk", "--user", "dis")
    time.sleep(0.2)
    codes = {fresh(two, token, "/workspaces/wk/jobs").status_code for _ in range(30)}
    assert codes == {403}, codes
    two.ok("user", "disable", "dis")
    time.sleep(0.2)
    assert {fresh(two, token).status_code for _ in range(30)} == {401}
    two.ok("user", "enable", "dis")
    time.sleep(0.2)
    assert {fresh(two, token).status_code for _ in range(30)} == {200}


def test_failed_sign_ins_are_counted_across_processes(
        tmp_path_factory: pytest.TempPathFactory, postgres_database: Callable[[], str]) -> None:
    limited = start(tmp_path_factory, postgres_database(), 6)
    try:
        pids = {fresh(limited, limited.token).json()["pid"] for _ in range(20)}
        assert len(pids) == 2  # the calls below land on both processes too
        codes = [fresh(limited, f"pat.wrong-{i}").status_code for i in range(14)]
        # 6 failures in all block the address, wherever they landed (a process that has not
        # blocked it yet lets one more through before it counts them all)
        assert codes.count(401) <= 6 + 1 and codes[-1] == 429, codes
        assert fresh(limited, limited.token).status_code == 429
    finally:
        limited.stop()
