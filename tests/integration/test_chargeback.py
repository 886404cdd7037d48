"""Usage and chargeback on a real server (issue 35): `usage report` from the attempts'
running intervals (GPU-hours within 1 % of them, a CSV pandas reads), prices, a budget that
warns on submit and one with `hold` that keeps a team's next job queued naming the budget;
bad values refused naming the field (exit 2, HTTP 422), nothing stored lost."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pytest

import strictkit
from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(300)
WS, CLUSTER, SIZE = "bill", "nc", "Standard_NC6"  # 1 GPU a node (the host offers none)


def _user(yard: Yard, name: str, team: str) -> str:
    yard.ok("user", "create", name)
    token = yard.js("token", "create", "--user", name, "--name", "tests")["token"]
    yard.ok("role", "assign", "-w", WS, "--user", name, "--role", "contributor")
    yard.ok("team", "add", team, name)
    return str(token)


def _submit(yard: Yard, token: str, name: str, seconds: float = 2) -> dict[str, Any]:
    spec = {"nodes": 1, "distribution": {"type": "custom"}, "command": f"sleep {seconds}"}
    resp = httpx.post(f"{yard.url}/api/v1/workspaces/{WS}/jobs", timeout=30,
                      headers={"Authorization": f"Bearer {token}"},
                      json={"spec": spec, "cluster": CLUSTER, "name": name})
    assert resp.status_code == 201, resp.text
    made: dict[str, Any] = resp.json()
    return made


def _gpu_hours(yard: Yard, names: list[str]) -> float:
    total = 0.0
    for name in names:
        for attempt in yard.job(name, workspace=WS)["attempts"]:
            total += (attempt["ended_at"] - attempt["started_at"]) * len(attempt["node_ids"])
    return total / 3600  # 1 GPU a node


@pytest.fixture(scope="module")
def teams(yard: Yard) -> dict[str, str]:
    yard.ok("workspace", "create", WS)
    yard.ok("cluster", "create", "-n", CLUSTER, "-w", WS, "-s", SIZE, "-t", "2")
    for team in ("vision", "nlp"):
        yard.ok("team", "create", team)
    tokens = {"vision": _user(yard, "vic", "vision"), "nlp": _user(yard, "nia", "nlp")}
    yard.wait_cluster(CLUSTER, 2, workspace=WS)
    for team, token in tokens.items():
        _submit(yard, token, f"{team}-1")
    for team in tokens:
        yard.wait_job(f"{team}-1", ("succeeded",), timeout=120, workspace=WS)
    return tokens


def test_usage_report_by_team_matches_the_attempts(yard: Yard, teams: dict[str, str]) -> None:
    yard.ok("price", "set", "-s", SIZE, "--per-hour", "3.10", "--currency", "EUR")
    data = yard.js("usage", "report", "--by", "team", "--since", "1d")
    rows = {r["team"]: r for r in data["rows"]}
    for team in ("vision", "nlp"):
        want = _gpu_hours(yard, [f"{team}-1"])
        got = rows[team]
        assert want > 0 and abs(got["gpu_hours"] - want) <= 0.01 * want, (got, want)
        assert abs(got["node_hours"] - want) <= 0.01 * want
        assert abs(got["cpu_hours"] - 6 * want) <= 0.06 * want  # 6 vCPUs a node
        assert got["currency"] == "EUR"
        assert abs(got["cost"] - 3.10 * got["node_hours"]) <= 1e-3
    by_user = {r["user"] for r in yard.js("usage", "report", "--by", "user")["rows"]}
    assert {"vic", "nia"} <= by_user
    by_size = yard.js("usage", "report", "--by", "size")["rows"]
    assert [r["size"] for r in by_size] == [SIZE]
    assert {r["cluster"] for r in yard.js("usage", "report", "--by", "cluster")["rows"]} \
        == {CLUSTER}
    assert {r["workspace"] for r in yard.js("usage", "report", "--by",
                                            "workspace")["rows"]} == {WS}
    table = yard.ok("usage", "report", "--by", "team").stdout
    assert "vision" in table and "EUR" in table
    nothing = yard.js("usage", "report", "--since", "2000-01-01", "--until", "2000-01-02")
    assert nothing["rows"] == []


def test_usage_report_csv_opens_in_pandas(yard: Yard, teams: dict[str, str]) -> None:
    pandas = strictkit.importorskip("pandas")
    text = yard.ok("usage", "report", "--by", "team", "-o", "csv").stdout
    frame = pandas.read_csv(io.StringIO(text))
    assert list(frame.columns) == ["team", "gpu_hours", "cpu_hours", "node_hours", "cost",
                                   "currency"]
    assert set(frame["team"]) >= {"vision", "nlp"}
    assert frame["gpu_hours"].dtype.kind == "f"


def test_sizes_without_a_price_show_none(yard: Yard, teams: dict[str, str]) -> None:
    yard.ok("cluster", "create", "-n", "cpu", "-w", WS, "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("cpu", 1, workspace=WS)
    spec = {"nodes": 1, "distribution": {"type": "custom"}, "command": "sleep 1"}
    resp = httpx.post(f"{yard.url}/api/v1/workspaces/{WS}/jobs", timeout=30,
                      headers={"Authorization": f"Bearer {teams['nlp']}"},
                      json={"spec": spec, "cluster": "cpu", "name": "on-cpu"})
    assert resp.status_code == 201, resp.text
    yard.wait_job("on-cpu", ("succeeded",), timeout=120, workspace=WS)
    rows = {r["size"]: r for r in yard.js("usage", "report", "--by", "size")["rows"]}
    assert rows["Standard_D2_v2"]["cost"] is None and rows["Standard_D2_v2"]["gpu_hours"] == 0
    assert rows["Standard_D2_v2"]["cpu_hours"] > 0


@pytest.mark.parametrize("args, field", [
    (("price", "set", "-s", SIZE, "--per-hour", "-1"), "--per-hour"),
    (("price", "set", "-s", "Standard_Nope", "--per-hour", "1"), "size"),
    (("budget", "set", "--team", "nosuch", "--gpu-hours", "5"), "team"),
    (("budget", "set", "--team", "nlp", "--gpu-hours", "-5"), "--gpu-hours"),
    (("budget", "set", "--team", "nlp", "--gpu-hours", "5", "--action", "stop"), "--action"),
    (("usage", "report", "--since", "yesterday-ish"), "--since"),
    (("team", "set", "nlp", "--shares", "-2"), "--shares"),
])
def test_bad_values_are_refused_naming_the_field(yard: Yard, teams: dict[str, str],
                                                 args: tuple[str, ...], field: str) -> None:
    result = yard.cli(*args)
    assert result.rc == 2, str(result)
    assert field in result.stderr + result.stdout, str(result)
    assert "Traceback" not in result.stderr


def test_bad_values_over_http_are_422(yard: Yard, teams: dict[str, str]) -> None:
    yard.ok("price", "set", "-s", SIZE, "--per-hour", "3.10", "--currency", "EUR")
    for method, path, body in (
            ("PUT", f"/prices/{SIZE}", {"per_hour": -1}),
            ("PUT", "/prices/Standard_Nope", {"per_hour": 1}),
            ("PUT", "/budgets/nosuch", {"gpu_hours": 1}),
            ("PUT", "/budgets/nlp", {"gpu_hours": -1}),
            ("PATCH", "/teams/nlp", {"shares": -1})):
        resp = yard.http.request(method, path, json=body)
        assert resp.status_code == 422, (path, resp.text)
    assert yard.http.get("/usage", params={"since": 10, "by": "planet"}).status_code == 422
    prices = {p["size"]: p for p in yard.http.get("/prices").json()}
    assert prices[SIZE]["per_hour"] == 3.10  # nothing stored was lost


def test_a_budget_warns_on_submit(yard: Yard, teams: dict[str, str]) -> None:
    yard.ok("budget", "set", "--team", "nlp", "--gpu-hours", "0", "--period", "month",
            "--action", "warn")
    made = _submit(yard, teams["nlp"], "nlp-warned", 0.1)
    assert any("budget of team nlp" in w for w in made.get("warnings", [])), made
    job = yard.write_job("nlp-warned-cli", {"name": "nlp-warned-cli", "nodes": 1,
                                            "distribution": {"type": "custom"},
                                            "command": "true", "cluster": CLUSTER})
    said = yard.cli("job", "create", "-f", str(job), "-w", WS,
                    env={"BATCHYARD_TOKEN": teams["nlp"]})  # the CLI's quick path says it too
    assert said.rc == 0 and "warning: " in said.stderr and "budget of team nlp" in said.stderr, \
        str(said)
    yard.wait_job("nlp-warned", ("succeeded",), timeout=120, workspace=WS)
    listed = {b["team"]: b for b in yard.js("budget", "list")}
    assert listed["nlp"]["used_gpu_hours"] > 0


def test_a_budget_with_hold_keeps_the_next_job_queued(yard: Yard,
                                                      teams: dict[str, str]) -> None:
    yard.ok("budget", "set", "--team", "vision", "--gpu-hours", "0", "--period", "month",
            "--action", "hold")
    _submit(yard, teams["vision"], "vision-held", 0.1)

    def reason() -> str | None:
        job = yard.job("vision-held", workspace=WS)
        assert job["state"] == "queued", json.dumps(job)[:500]
        text = job.get("pending_reason") or ""
        return text if "budget" in text else None

    said = wait_until(reason, 30, 0.2, "the held job's reason naming the budget")
    assert "budget of team vision" in said and "GPU-h this month" in said, said
    other = _submit(yard, teams["nlp"], "nlp-free", 0.1)  # another team is not held
    assert other["name"] == "nlp-free"
    yard.wait_job("nlp-free", ("succeeded",), timeout=120, workspace=WS)
    assert yard.job("vision-held", workspace=WS)["state"] == "queued"
    yard.ok("budget", "set", "--team", "vision", "--gpu-hours", "1000", "--action", "hold")
    yard.wait_job("vision-held", ("succeeded",), timeout=120, workspace=WS)


def test_a_removed_team_keeps_its_history(yard: Yard, teams: dict[str, str]) -> None:
    before = {r["team"]: r for r in yard.js("usage", "report", "--by", "team")["rows"]}
    yard.ok("team", "create", "gone")
    yard.ok("team", "add", "gone", "nia")  # nia's oldest team stays nlp
    yard.ok("user", "create", "gus")
    token = yard.js("token", "create", "--user", "gus", "--name", "tests")["token"]
    yard.ok("role", "assign", "-w", WS, "--user", "gus", "--role", "contributor")
    yard.ok("team", "add", "gone", "gus")
    _submit(yard, token, "gone-1", 0.5)
    yard.wait_job("gone-1", ("succeeded",), timeout=120, workspace=WS)
    yard.ok("team", "delete", "gone")
    assert "gone" not in {t["name"] for t in yard.js("team", "list")}
    after = {r["team"]: r for r in yard.js("usage", "report", "--by", "team")["rows"]}
    assert after["gone"]["gpu_hours"] > 0
    assert after["nlp"]["gpu_hours"] >= before["nlp"]["gpu_hours"]
    assert yard.cli("team", "delete", "gone").rc == 3  # not found
