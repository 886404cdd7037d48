"""Every route of the server against every caller (issue 32), over HTTP on a real server.

The routes come from the application's own route table; each must declare a rule, and the
rule it declares must be the one this file expects for it (``RULES``): a new route, or one
whose rule changed, fails here until this table says what it should be. Each caller then
calls each route and must get what the rule means for it:

    ok    past authorisation: the route's own answer (2xx, 3xx, or a 404/409/422 about what
          was asked), never 401, 403 or a 5xx
    401   no credential, or one that is not valid here (a job token off its job's routes,
          a node credential off its node's)
    403   a valid credential without the role; the answer names the role needed
    login (the portal) a browser without a session: sent to the sign-in page, or 401 for data

Callers: the admin (the home's token), the owner, a contributor, a reader of workspace A, a
user with no role, the owner of workspace B, a running job's token (a job of A's owner), a
machine's node credential (a machines cluster of A), and no token at all. The portal's
routes are called with each user's signed-in browser session instead of the token."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from teamkit import CLUSTER_A, WS_A, Team, job_token, make_team
from yardkit import Yard

pytestmark = pytest.mark.timeout(600)
CALLERS = ("none", "node", "job", "norole", "other_owner", "reader", "contributor", "owner",
           "admin")
USERS = ("norole", "other_owner", "reader", "contributor", "owner", "admin")
RANK = {"reader": 1, "contributor": 2, "owner": 3, "admin": 4}
A_ROLE = {"owner": 3, "contributor": 2, "reader": 1, "admin": 4}

RULES: dict[str, list[str]] = {
    "public": [
        "GET /api/v1/openapi.json", "GET /api/v1/docs", "GET /docs/oauth2-redirect",
        "GET /api/v1/ca.pem", "POST /api/v1/agent/join", "GET /api/v1/auth/methods",
        "GET /login", "POST /login", "GET /static/portal/{path}", "GET /signin",
        "POST /api/v1/auth/oidc/device", "POST /api/v1/auth/oidc/device/token",
        "POST /api/v1/auth/oidc/token", "GET /login/sso", "GET /login/sso/callback"],
    "signed-in": [
        "GET /api/v1/health", "GET /api/v1/schema/job", "POST /api/v1/snapshots",
        "GET /api/v1/workspaces", "GET /api/v1/teams", "GET /api/v1/auth/me",
        "POST /api/v1/auth/logout", "POST /api/v1/tokens", "GET /api/v1/tokens",
        "DELETE /api/v1/tokens/{token_id}", "GET /api/v1/prices", "GET /api/v1/budgets"],
    "person": ["POST /api/v1/auth/login", "POST /api/v1/portal/sign-in-links"],
    "admin": [
        "POST /api/v1/workspaces", "DELETE /api/v1/workspaces/{ws}",
        "POST /api/v1/workspaces/{ws}/clusters/{name}/nodes/{node}/exec",
        "WEBSOCKET /api/v1/workspaces/{ws}/clusters/{name}/nodes/{node}/exec",
        "PUT /api/v1/workspaces/{ws}/quotas", "POST /api/v1/users", "GET /api/v1/users",
        "GET /api/v1/users/{user}", "POST /api/v1/users/{user}/disable",
        "POST /api/v1/users/{user}/enable", "POST /api/v1/users/{user}/tokens",
        "GET /api/v1/users/{user}/tokens", "POST /api/v1/teams", "PATCH /api/v1/teams/{team}",
        "DELETE /api/v1/teams/{team}",
        "POST /api/v1/teams/{team}/members", "DELETE /api/v1/teams/{team}/members/{user}",
        "GET /api/v1/audit", "GET /api/v1/usage", "PUT /api/v1/prices/{size}",
        "PUT /api/v1/budgets/{team}",
        "PUT /api/v1/workspaces/{ws}/clusters/{name}/guarantees/{team}",
        "DELETE /api/v1/workspaces/{ws}/clusters/{name}/guarantees/{team}"],
    "reader": [
        "GET /api/v1/workspaces/{ws}/jobs",
        "GET /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}",
        "GET /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/files",
        "GET /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/files/content",
        "GET /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/logs",
        "GET /api/v1/workspaces/{ws}", "GET /api/v1/workspaces/{ws}/clusters",
        "GET /api/v1/workspaces/{ws}/clusters/{name}",
        "GET /api/v1/workspaces/{ws}/clusters/{name}/nodes",
        "GET /api/v1/workspaces/{ws}/clusters/{name}/files",
        "GET /api/v1/workspaces/{ws}/clusters/{name}/files/content",
        "GET /api/v1/workspaces/{ws}/experiments", "GET /api/v1/workspaces/{ws}/experiments/{exp}",
        "GET /api/v1/workspaces/{ws}/usage", "GET /api/v1/workspaces/{ws}/datastores",
        "GET /api/v1/workspaces/{ws}/datastores/{name}",
        "GET /api/v1/workspaces/{ws}/datastores/{name}/files",
        "GET /api/v1/workspaces/{ws}/datastores/{name}/files/{path:path}",
        "GET /api/v1/workspaces/{ws}/sweeps",
        "GET /api/v1/workspaces/{ws}/experiments/{exp}/sweeps/{name}",
        "GET /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/stacks",
        "GET /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/stacks/{ident}",
        "GET /api/v1/workspaces/{ws}/roles",
        "GET /api/v1/workspaces/{ws}/clusters/{name}/guarantees"],
    "reader+job": [
        "GET /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/metrics",
        "GET /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/tags"],
    "contributor": [
        "POST /api/v1/workspaces/{ws}/jobs", "POST /api/v1/workspaces/{ws}/experiments",
        "POST /api/v1/workspaces/{ws}/jobs/what-if",
        "PUT /api/v1/workspaces/{ws}/datastores/{name}/files/{path:path}",
        "POST /api/v1/workspaces/{ws}/sweeps"],
    "contributor-own": [
        "POST /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/terminate",
        "DELETE /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}",
        "POST /api/v1/workspaces/{ws}/experiments/{exp}/sweeps/{name}/cancel",
        "POST /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/stacks"],
    "contributor-own+job": [
        "POST /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/metrics",
        "POST /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/tags",
        "WEBSOCKET /api/v1/workspaces/{ws}/experiments/{exp}/jobs/{name}/exec"],
    "owner": [
        "PATCH /api/v1/workspaces/{ws}",
        "POST /api/v1/workspaces/{ws}/clusters/{name}/join-tokens",
        "GET /api/v1/workspaces/{ws}/clusters/{name}/join-tokens",
        "DELETE /api/v1/workspaces/{ws}/clusters/{name}/join-tokens",
        "POST /api/v1/workspaces/{ws}/clusters",
        "POST /api/v1/workspaces/{ws}/clusters/{name}/resize",
        "DELETE /api/v1/workspaces/{ws}/clusters/{name}",
        "POST /api/v1/workspaces/{ws}/clusters/{name}/autoscale",
        "POST /api/v1/workspaces/{ws}/clusters/{name}/nodes/{node}/preempt",
        "POST /api/v1/workspaces/{ws}/clusters/{name}/nodes/{node}/enable",
        "DELETE /api/v1/workspaces/{ws}/experiments/{exp}",
        "POST /api/v1/workspaces/{ws}/datastores",
        "DELETE /api/v1/workspaces/{ws}/datastores/{name}",
        "POST /api/v1/workspaces/{ws}/roles", "DELETE /api/v1/workspaces/{ws}/roles",
        "GET /api/v1/workspaces/{ws}/audit"],
    "node": [
        "POST /api/v1/agent/nodes/{node}/heartbeat",
        "POST /api/v1/agent/nodes/{node}/commands/{command_id}",
        "POST /api/v1/agent/nodes/{node}/sessions/{ident}/out",
        "GET /api/v1/agent/nodes/{node}/sessions/{ident}/in"],
    "launcher": [
        f"{m} /api/v1/node/attempts/{{attempt}}/nodes/{{node_rank}}/{p}" for m, p in (
            ("GET", "plan"), ("GET", "snapshots/{sha}"), ("POST", "status"), ("POST", "logs"),
            ("GET", "control"), ("POST", "rendezvous"), ("GET", "rendezvous"),
            ("POST", "relay"), ("GET", "relay/{ident}"), ("PUT", "outputs/{path:path}"),
            ("POST", "sessions/{ident}/out"), ("GET", "sessions/{ident}/in"),
            ("POST", "stacks"))],
    "portal:signed-in": ["POST /logout", "GET /"],
    "portal:admin": ["GET /usage"],
    "portal:reader": [
        "GET /clusters", "GET /experiments", "GET /jobs", "GET /ws/{ws}/exp/{exp}",
        "GET /ws/{ws}/exp/{exp}/jobs/{name}", "GET /portal/api/ws/{ws}/clusters",
        "GET /portal/api/ws/{ws}/jobs", "GET /portal/api/ws/{ws}/exp/{exp}/jobs/{name}",
        "GET /portal/api/ws/{ws}/exp/{exp}/jobs/{name}/files",
        "GET /portal/api/ws/{ws}/exp/{exp}/jobs/{name}/files/content",
        "GET /portal/api/ws/{ws}/exp/{exp}/jobs/{name}/metrics",
        "GET /portal/api/ws/{ws}/exp/{exp}/metric",
        "GET /portal/api/ws/{ws}/exp/{exp}/jobs/{name}/logs",
        "GET /ws/{ws}/exp/{exp}/sweeps/{name}", "GET /portal/api/ws/{ws}/exp/{exp}/sweeps/{name}",
        "GET /portal/tensorboard/ws/{ws}/exp/{exp}/jobs/{name}",
        "GET /portal/tensorboard/ws/{ws}/exp/{exp}/jobs/{name}/{rest:path}",
        "POST /portal/tensorboard/ws/{ws}/exp/{exp}/jobs/{name}/{rest:path}"],
    "scrape": ["GET /metrics"],
    "admin+job": [  # MLflow's tracking API (issue 38): a job's own run, or an admin
        *[f"{m} /api/2.0/mlflow/{p}" for m, p in (
            ("GET", "experiments/get-by-name"), ("GET", "experiments/get"),
            ("POST", "experiments/create"), ("GET", "experiments/search"),
            ("POST", "experiments/search"), ("POST", "runs/create"), ("GET", "runs/get"),
            ("POST", "runs/update"), ("POST", "runs/search"), ("POST", "runs/log-metric"),
            ("POST", "runs/log-batch"), ("POST", "runs/log-parameter"),
            ("POST", "runs/set-tag"), ("POST", "runs/delete-tag"),
            ("POST", "runs/log-inputs"), ("POST", "runs/outputs"),
            ("GET", "metrics/get-history"), ("POST", "logged-models"),
            ("POST", "logged-models/search"), ("GET", "logged-models/{model_id}"),
            ("PATCH", "logged-models/{model_id}"), ("PATCH", "logged-models/{model_id}/tags"),
            ("DELETE", "logged-models/{model_id}/tags/{key}"),
            ("POST", "logged-models/{model_id}/params"))],
        "GET /api/2.0/mlflow-artifacts/artifacts",
        "GET /api/2.0/mlflow-artifacts/artifacts/{path:path}",
        "PUT /api/2.0/mlflow-artifacts/artifacts/{path:path}",
        *[f"{m} {prefix}/{{rest:path}}" for prefix in (
            "/ajax-api/{version}/mlflow", "/api/{version}/mlflow-artifacts",
            "/api/{version}/mlflow") for m in ("DELETE", "GET", "PATCH", "POST", "PUT")]],
    "portal:contributor-own": ["POST /ws/{ws}/exp/{exp}/jobs/{name}/terminate",
                               "POST /ws/{ws}/exp/{exp}/jobs/{name}/delete"],
}
EXPECTED = {route: label for label, routes in RULES.items() for route in routes}


def app_routes() -> list[tuple[str, str]]:
    """(METHOD path, rule label) of every route of the real application."""
    import tempfile

    from batchyard.server.app import create_app
    from batchyard.server.context import ServerContext
    from batchyard.server.security.permissions import route_rules
    from batchyard.store.db import Database

    with tempfile.TemporaryDirectory() as tmp:  # never connected to: the table only
        db = Database(f"sqlite:///{tmp}/unused.db")
        app = create_app(ServerContext(db=db, admin_token="unused"))
        db.engine.dispose()
    return [(f"{m} {p}", label) for m, p, label in route_rules(app)]


ROUTES = app_routes()


def expected(label: str, caller: str, route: str) -> str:
    """What ``caller`` must get from a route with rule ``label`` (targets as ``_values``
    picks them: workspace A, jobs and sweeps of A's owner, the job token's own job)."""
    portal = label.startswith("portal:")
    base = label.removeprefix("portal:")
    if route == "POST /login":  # signing in: the form's token (the caller's) decides
        return "ok" if caller in USERS else "401"
    if route == "GET /signin":  # a one-time link's own token decides, whoever calls: none here
        return "401"
    if base == "scrape":  # on a loopback server: no token, else the scrape or home token
        return "ok" if caller in ("none", "admin") else "401"
    if base == "admin+job":
        return "ok" if caller in ("job", "admin") else "401" if caller in ("none", "node") \
            else "403"
    if base == "public":
        return "ok"
    if portal and caller not in USERS:  # no session: to the sign-in page (data: a 401)
        return "401" if route.split(" ", 1)[1].startswith("/portal/api/") else "login"
    if base == "launcher":
        return "401"
    if base == "node":
        return "ok" if caller == "node" else "401"
    if caller in ("none", "node") or (caller == "job" and not base.endswith("+job")):
        return "401"
    if caller == "job":
        return "ok"  # its own job: the targets of +job routes are
    if base in ("signed-in", "person"):
        return "ok"
    if base == "admin":
        return "ok" if caller == "admin" else "403"
    need = {"reader": 1, "contributor": 2, "owner": 3}[base.split("-")[0].split("+")[0]]
    have = A_ROLE.get(caller, 0)
    if "-own" in base and have == 2:
        return "403"  # the targets are the owner's jobs and sweeps
    return "ok" if have >= need else "403"


@pytest.fixture(scope="module")
def world(yard: Yard) -> Iterator[dict[str, Any]]:
    team = make_team(yard)
    team.submit("owner", "tokjob", command='echo "T=$BATCHYARD_TOKEN"; sleep 900')
    for victim in ("victim", "victim2"):
        team.submit("owner", victim)
    token = job_token(team, "tokjob")
    job_id = team.api("admin", "GET", f"/workspaces/{WS_A}/experiments/default/jobs/tokjob"
                      ).json()["id"]
    sweep = yard.write_job("swp", {
        "name": "swp", "nodes": 1, "distribution": {"type": "custom"}, "command": "sleep 1",
        "sweep": {"search_space": {"x": {"type": "choice", "values": [1]}},
                  "sampling": {"type": "random", "seed": 1},
                  "objective": {"primary_metric": "m", "goal": "maximize"},
                  "limits": {"max_total_trials": 1, "max_concurrent_trials": 1}}})
    team.ok("owner", "sweep", "create", "-f", str(sweep), "-w", WS_A, "-c", CLUSTER_A)
    yard.ok("cluster", "create", "-n", "farm", "-w", WS_A, "--backend", "machines", "-s",
            "Standard_D2_v2")
    join = yard.js("cluster", "join-command", "-n", "farm", "-w", WS_A)
    joined = httpx.post(yard.url + "/api/v1/agent/join", json={
        "join_token": join["token"], "machine_id": "matrix-machine-0001",
        "hostname": "matrix-box", "address": "127.0.0.1", "work_dir": str(yard.work / "box"),
        "resources": {"cpus": 1, "memory_gb": 1, "gpus": 0}}, timeout=30)
    assert joined.status_code == 200, joined.text
    sessions = {who: _signed_in(yard, team.token(who)) for who in USERS}
    yield {"team": team, "job": token, "job_id": job_id, "node": joined.json()["credential"],
           "node_name": joined.json()["node"], "sessions": sessions, "counts": {}}
    for client in sessions.values():
        client.close()
    team.cli("admin", "job", "terminate", "tokjob", "-w", WS_A)
    team.cli("admin", "sweep", "cancel", "swp", "-w", WS_A)


def _signed_in(yard: Yard, token: str) -> httpx.Client:
    """A browser signed in to the portal with ``token``, and its CSRF token."""
    client = httpx.Client(base_url=yard.url, timeout=30, follow_redirects=False,
                          headers={"Origin": yard.url})
    answer = client.post("/login", data={"token": token, "next": "/"})
    assert answer.status_code == 303, answer.text
    page = client.get("/ws/nowhere/exp/x")  # any page (a 403 one too) carries the token
    found = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert found, page.text[:500]
    client.headers["X-CSRF-Token"] = found.group(1)
    return client


def _values(world: dict[str, Any], route: str) -> dict[str, str]:
    """Path values that reach past authorisation without breaking the fixtures: A's things
    for what is read, names that do not exist for what would delete or change them."""
    method, path = route.split(" ", 1)
    changes = method not in ("GET", "WEBSOCKET")
    name = "tokjob"
    if "/clusters/{name}" in path:
        name = "zz-none" if changes else CLUSTER_A
    elif "/datastores/{name}" in path:
        name = "zz-none"
    elif "/sweeps/{name}" in path:
        name = "swp"
    elif path.endswith(("/terminate", "/jobs/{name}")) and method in ("POST", "DELETE"):
        name = "victim"
    if path.startswith(("/ws/", "/portal/")) and path.endswith(("/terminate", "/delete")):
        name = "victim2"
    return {"ws": "zz-none" if route == "DELETE /api/v1/workspaces/{ws}" else WS_A,
            "exp": "default", "name": name, "node": world["node_name"] if "/agent/" in path
            else "zz-node", "attempt": "00000000-0000-0000-0000-000000000000",
            "node_rank": "0", "sha": "0" * 64, "ident": "zz", "command_id": "0",
            "token_id": "999999", "user": "zz-nobody", "team": "zz-noteam", "size": "zz-size",
            "model_id": f"m-{world['job_id']:08x}{'0' * 24}", "key": "zz", "version": "2.0",
            "rest:path": "runs/zz",
            "path:path": "x.txt", "path": "portal.css"}


def _call(world: dict[str, Any], route: str, caller: str) -> tuple[int, Any]:
    team: Team = world["team"]
    method, path = route.split(" ", 1)
    values = _values(world, route)
    url = re.sub(r"\{([^}]+)\}", lambda m: values[m.group(1)], path)
    headers = {}
    if caller in ("job", "node"):
        headers["Authorization"] = f"Bearer {world[caller]}"
    elif caller != "none":
        headers["Authorization"] = f"Bearer {team.token(caller)}"
    if method == "WEBSOCKET":
        return _websocket(team.yard, url, headers)
    portal = not url.startswith(("/api/", "/docs", "/static/", "/ajax-api/", "/metrics"))
    if route == "POST /login":
        token = headers.get("Authorization", "Bearer ").split(" ", 1)[1]
        with httpx.Client(base_url=team.yard.url, timeout=30) as fresh:
            answer = fresh.post(url, data={"token": token},
                                headers={"Origin": team.yard.url})
        return answer.status_code, answer
    if portal and caller in USERS:
        client = world["sessions"][caller]
        if route == "POST /logout":  # a session of its own: the shared one stays signed in
            client = _signed_in(team.yard, team.token(caller))
        params = {"ws": WS_A} if path in ("/clusters", "/jobs", "/experiments") else None
        data = {"csrf": client.headers["X-CSRF-Token"]} if method == "POST" else None
        with client.stream(method, url, params=params, data=data) as answer:
            if answer.status_code >= 400 or "event-stream" not in answer.headers.get(
                    "content-type", ""):
                answer.read()
        return answer.status_code, answer
    kwargs: dict[str, Any] = {}
    if method in ("POST", "PUT", "PATCH") and not portal:
        kwargs["json"] = {}
    with httpx.Client(base_url=team.yard.url, timeout=30, headers=headers) as client, \
            client.stream(method, url, **kwargs) as answer:
        if answer.status_code >= 400 or "event-stream" not in answer.headers.get(
                "content-type", ""):
            answer.read()
    return answer.status_code, answer


def _websocket(yard: Yard, url: str, headers: dict[str, str]) -> tuple[int, Any]:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    target = yard.url.replace("http://", "ws://") + url + "?argv=true"
    try:
        with connect(target, additional_headers=headers, open_timeout=30) as socket:
            socket.close()
            return 101, None
    except InvalidStatus as exc:  # refused before the handshake: an HTTP answer
        return exc.response.status_code, _Refusal(bytes(exc.response.body or b""))


class _Refusal:
    """A WebSocket handshake's refusal, read as an HTTP answer's body is."""

    def __init__(self, body: bytes) -> None:
        self.text = body.decode("utf-8", "replace")

    def json(self) -> Any:
        import json

        return json.loads(self.text)


def _outcome(status: int, answer: Any) -> str:
    if status in (401, 403):
        return str(status)
    if status == 303 and str(getattr(answer, "headers", {}).get("location", "")).startswith(
            "/login?next="):  # (a signing out goes to /login itself)
        return "login"
    return "5xx" if status >= 500 else "ok"


def test_every_route_declares_the_rule_this_table_expects() -> None:
    found = dict(ROUTES)
    missing = [r for r, label in ROUTES if label == "MISSING"]
    assert not missing, f"routes without an authorisation rule: {missing}"
    unknown = sorted(set(found) - set(EXPECTED))
    assert not unknown, f"routes this table does not know (add each with its rule): {unknown}"
    gone = sorted(set(EXPECTED) - set(found))
    assert not gone, f"routes this table expects that the app no longer has: {gone}"
    changed = {r: (found[r], EXPECTED[r]) for r in found if found[r] != EXPECTED[r]}
    assert not changed, f"rules that differ from this table's (declared, expected): {changed}"


@pytest.mark.parametrize(("route", "label"), ROUTES, ids=[r for r, _ in ROUTES])
def test_each_caller_gets_what_the_rule_says(world: dict[str, Any], route: str,
                                             label: str) -> None:
    got = {}
    for caller in CALLERS:
        status, answer = _call(world, route, caller)
        got[caller] = (_outcome(status, answer), status)
        want = expected(EXPECTED.get(route, label), caller, route)
        assert got[caller][0] == want, (route, caller, want, status,
                                        getattr(answer, "text", "")[:300])
        if status == 403 and label == "admin+job":  # MLflow's own error shape
            error = answer.json()
            assert error["error_code"] == "PERMISSION_DENIED" and "admin" in \
                error["message"], (route, caller, error)
        elif status == 403 and route.split(" ", 1)[1].startswith("/api/"):
            error = answer.json()["error"]
            assert error["code"] == "forbidden" and error.get("details", {}).get("needed"), \
                (route, caller, error)
            assert error["details"]["needed"] in error["message"] or "service" in \
                error["message"], error
    world["counts"][route] = len(got)


def test_the_table_size(world: dict[str, Any], request: pytest.FixtureRequest) -> None:
    """Runs last: how many (route, caller) pairs were checked."""
    pairs = sum(world["counts"].values())
    line = (f"route-by-caller table: {len(ROUTES)} routes x {len(CALLERS)} callers = "
            f"{len(ROUTES) * len(CALLERS)} pairs ({pairs} checked in this run)")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    print(line)
    assert len(ROUTES) * len(CALLERS) >= 1000
