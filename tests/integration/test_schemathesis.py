"""A bounded schemathesis run over every operation of the real server's OpenAPI, once with the
admin token and once with a running job's own token: no input the schema allows (and none
schemathesis derives from it to break it) may make the server answer 5xx.

Bounded: ``BATCHYARD_FUZZ_EXAMPLES`` examples per operation (default 12, a few thousand
requests in all); the count of cases is printed at the end of the module."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from yardkit import Yard, wait_until

EXAMPLES = int(os.environ.get("BATCHYARD_FUZZ_EXAMPLES", "12"))
COUNTS: Counter[str] = Counter()
OPERATIONS: set[str] = set()
FAILURES: list[str] = []


@pytest.fixture(scope="module")
def fuzz_yard(yard: Yard, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A cluster, a running job whose token the second pass uses, and the schema."""
    yard.ok("cluster", "create", "-n", "fz", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("fz", 1)
    folder, mount = yard.exchange("tok")  # the job writes its token there
    token_file = folder / "job-token"
    job = yard.write_job("tok", {
        "name": "tok", "cluster": "fz", "distribution": {"type": "custom"}, "mounts": [mount],
        "command": f"printf %s \"$BATCHYARD_TOKEN\" > {token_file}.part && "
                   f"mv {token_file}.part {token_file} && sleep 600"})
    yard.ok("job", "create", "-f", str(job))
    wait_until(token_file.exists, 120)
    spec = yard.http.get("/openapi.json").json()
    yield {"schema": schemathesis.openapi.from_dict(spec), "job_token": token_file.read_text()}
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    line = (f"schemathesis: {COUNTS['cases']} cases over {len(OPERATIONS)} operations, "
            f"{COUNTS['admin']} as admin + {COUNTS['job']} with a job token; "
            f"status classes {dict(sorted((k, v) for k, v in COUNTS.items() if 'xx' in k))}; "
            f"{len(FAILURES)} server errors")
    if reporter is not None:
        reporter.write_line(line)
    print(line)
    yard.cli("job", "terminate", "-n", "tok")


# Names that exist, so that cases also reach past the lookups (random names only meet 404s).
KNOWN = {"ws": "default", "exp": "default", "cluster": "fz", "node": "fz-0"}
SPARED = ("DELETE", "/terminate", "/resize", "/revoke")  # keep the fixtures standing


def _known(case: Any) -> dict[str, Any] | None:
    """The case's path parameters with names replaced by existing ones, where that is safe."""
    params = dict(case.path_parameters or {})
    if not params or case.method.upper() == "DELETE" \
            or any(part in case.path for part in SPARED[1:]):
        return None
    for key in params:
        if key in KNOWN:
            params[key] = KNOWN[key]
        elif key == "name":
            params[key] = "fz" if "/clusters/" in case.path else "tok"
    return params


def _call(case: Any, yard: Yard, job_token: str) -> None:
    if case.query and case.query.get("follow") not in (None, False, "false"):
        case.query = {**case.query, "follow": False}  # a followed running job never ends
    known = _known(case)
    for n, (who, token) in enumerate((("admin", yard.token), ("job", job_token)) * 2):
        if n == 2:
            if known is None:
                return
            case.path_parameters = known  # then the same case against existing names
        started = time.monotonic()
        try:
            response = case.call(base_url=yard.url,
                                 headers={"Authorization": f"Bearer {token}"}, timeout=60)
        except (httpx.HTTPError, OSError) as exc:  # no answer at all is a failure too
            FAILURES.append(f"{who} {case.method} {case.formatted_path}: {exc!r}")
            raise
        COUNTS["cases"] += 1
        COUNTS[who] += 1
        COUNTS[f"{response.status_code // 100}xx"] += 1
        if response.status_code >= 500:
            FAILURES.append(f"{who} {case.method} {case.formatted_path}")
        assert response.status_code < 500, (
            f"{who}: {case.method} {case.formatted_path} -> {response.status_code} "
            f"after {time.monotonic() - started:.2f}s: {response.text[:500]}\n"
            f"reproduce: {case.as_curl_command()}")


def test_no_server_errors(yard: Yard, fuzz_yard: dict[str, Any]) -> None:
    """Every operation, in the schema's order; hypothesis shrinks a failing case before the
    assertion reports it (schemathesis's pytest plugin does not load under pytest 9)."""
    for found in fuzz_yard["schema"].get_all_operations():
        operation = found.ok()
        OPERATIONS.add(f"{operation.method.upper()} {operation.path}")

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        @given(case=operation.as_strategy())
        def run(case: Any) -> None:
            _call(case, yard, fuzz_yard["job_token"])

        run()
    assert not FAILURES
